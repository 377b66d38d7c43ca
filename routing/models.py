"""Typed shapes shared by the router, the workflow and the store."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from routing.sources import SOURCE_TYPES as SOURCE_TYPES
from routing.sources import SOURCES
from routing.text import MAX_DETAIL_CHARS, clean_optional

# Views of the source-type table (routing/sources.py) for the modules that read a trust mode or the public
# source types by these names (SOURCE_TYPES is re-exported); the table is the one place that knows them.
TRUST_BY_SOURCE: Mapping[str, str] = MappingProxyType({name: SOURCES[name].trust_mode for name in SOURCE_TYPES})

OnFault = Literal["continue", "hold"]
# "continue": a faulted rule is a no-match (SPEC-0020). "hold": any fault stops evaluation and the event is
# stored as faulted, minting nothing, so owners who gate trust with drop rules fail closed.
ON_FAULT_VALUES: tuple[str, ...] = ("continue", "hold")


class Target(BaseModel):
    """One live delivery target of a webhook, with the scope queues read from switchboard state."""

    endpoint_id: str
    scope_queues: list[str]


class Grant(BaseModel):
    """Everything a delivery may reach, computed from switchboard state for one delivery."""

    webhook_id: str
    owner_endpoint_id: str
    human_id: str
    source: str
    target_queue: str
    allowed_queues: list[str]
    targets: list[Target]
    rules: list[dict[str, Any]] = Field(default_factory=list)
    default_action: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    subject_path: str | None = None  # the webhook's coalescing subject path (configure_webhook)
    on_fault: OnFault = "continue"

    def queues(self) -> list[str]:
        """Queues a rule may name: the target queue plus the owner's allowed webhook queues."""
        out = [self.target_queue]
        out.extend(q for q in self.allowed_queues if q not in out)
        return out


class Fault(BaseModel):
    """A rule that did not match because it could not be evaluated."""

    rule_index: int
    rule_id: str | None = None
    cause: Literal["error", "timeout", "compile_error", "budget_exhausted", "sandbox_busy", "sandbox_failure"]
    detail: str | None = None

    @field_validator("rule_id", "detail")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # A jq error message may quote the payload (NUL and all); the trace is a jsonb column (routing.text).
        return clean_optional(value, MAX_DETAIL_CHARS)


class Evaluation(BaseModel):
    """What the sandbox reports: the first matching rule index (or none) and the faults on the way."""

    matched_index: int | None = None
    faults: list[Fault] = Field(default_factory=list)


class Delivery(BaseModel):
    """One todo to mint: an endpoint and a queue."""

    endpoint_id: str
    queue: str


class Decision(BaseModel):
    """The router's verdict for one delivery, applied by the commit activity."""

    disposition: Literal["routed", "dropped", "faulted"]
    deliveries: list[Delivery] = Field(default_factory=list)
    trace: dict[str, Any]
    once_key: str | None = None
    work_order: dict[str, Any] | None = None
    coalesce: bool = False
    subject_key: str | None = None
