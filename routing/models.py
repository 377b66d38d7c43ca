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


class TriageQueue(BaseModel):
    """A queue LLM triage may choose, with the owner's description of what belongs there."""

    queue: str
    description: str = ""


class TriageConfig(BaseModel):
    """A webhook's LLM triage stage (set_llm_triage), as saved: provider, model, queues, threshold, budgets."""

    provider: str
    model: str
    queues: list[TriageQueue]
    threshold: float
    per_minute: int
    per_day: int
    include_payload: bool = False
    include_payload_set_at: str | None = None  # ISO time the owner enabled full payload text (egress record)
    include_payload_set_by: str | None = None  # the endpoint that did
    timeout_seconds: float | None = None  # None: the provider's own timeout

    def queue_names(self) -> list[str]:
        """The queues the model may answer with, in the owner's order."""
        return [q.queue for q in self.queues]


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
    # The webhook's LLM triage stage, when configured; a history recorded before triage existed has none.
    llm_triage: TriageConfig | None = None
    # The webhook's trust gate as stored (routing/trust.py reads it; one that cannot be read trusts no one);
    # None: no gate, every delivery goes to the rules.
    trusted_actors: dict[str, Any] | None = None

    def queues(self) -> list[str]:
        """Queues a rule may name: the target queue plus the owner's allowed webhook queues."""
        out = [self.target_queue]
        out.extend(q for q in self.allowed_queues if q not in out)
        return out


# Why a rule could not be evaluated (sandbox and child causes; recorded on the trace's faults).
FaultCause = Literal["error", "timeout", "compile_error", "budget_exhausted", "sandbox_busy", "sandbox_failure"]
# What a decision does with a delivery. The stored event adds "repeat": a once-key another event claimed.
# "quarantined": held for a person (the trust gate, or a {"quarantine": true} action) until released or dismissed.
Disposition = Literal["routed", "dropped", "faulted", "quarantined"]
EventDisposition = Literal["routed", "dropped", "repeat", "faulted", "quarantined"]
EVENT_DISPOSITIONS: tuple[str, ...] = ("routed", "dropped", "repeat", "faulted", "quarantined")
# The trace's stage: what decided. "fault" is a delivery held on a fault (or whose commit was refused);
# "trust_gate" a delivery the webhook's trusted_actors quarantined before any rule (routing/trust.py).
Stage = Literal["rule", "llm", "default", "fault", "trust_gate"]
# Why LLM triage declined and the default decided (SPEC-0020 "LLM Triage Stage", "Cost and Latency Bounds").
TriageCause = Literal["llm_rejected", "llm_low_confidence", "llm_timeout", "llm_error", "budget_exhausted"]
TRIAGE_CAUSES: tuple[str, ...] = ("llm_rejected", "llm_low_confidence", "llm_timeout", "llm_error", "budget_exhausted")
# The trace's cause: why the default decided, or why the delivery was held.
Cause = Literal[
    "no_match_default",
    "rule_not_granted",
    "default_not_granted",
    "held_on_fault",
    "commit_failed",
    "start_refused",
    "llm_rejected",
    "llm_low_confidence",
    "llm_timeout",
    "llm_error",
    "budget_exhausted",
    "untrusted_actor",
]


class Fault(BaseModel):
    """A rule that did not match because it could not be evaluated."""

    rule_index: int
    rule_id: str | None = None
    cause: FaultCause
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


class EvaluateInput(BaseModel):
    """The evaluate step's input (the evaluate_rules activity's): a rule list and its params on one envelope."""

    rules: list[dict[str, Any]]
    params: dict[str, Any] | None = None
    envelope: dict[str, Any]


class Mint(BaseModel):
    """One todo to mint: an endpoint and a queue."""

    endpoint_id: str
    queue: str


class Decision(BaseModel):
    """The router's verdict for one delivery, applied by the commit activity."""

    disposition: Disposition
    todos: list[Mint] = Field(default_factory=list)
    trace: dict[str, Any]
    once_key: str | None = None
    work_order: dict[str, Any] | None = None
    coalesce: bool = False
    subject_key: str | None = None
