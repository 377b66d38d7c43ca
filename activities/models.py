"""Inputs and results of the activities (one model each, so fields can be added later)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from routing.delivery import DeliveryInput
from routing.models import EvaluateInput, Evaluation, Grant


class LoadGrantInput(BaseModel):
    webhook_id: str


class LoadGrantResult(BaseModel):
    """The grant, or None when the webhook no longer exists."""

    grant: Grant | None = None


class UpkeepInput(BaseModel):
    retention_days: int = 30
    # ReapTodos: how many reaps one run makes, `every_seconds` apart. The schedule starts one run an hour that
    # reaps every 30 s, so the Temporal UI lists 24 reaper runs a day instead of 2,880. The defaults (one
    # reap) are what runs recorded before the loop carry, so their histories replay unchanged.
    rounds: int = Field(default=1, ge=1, le=1000)
    every_seconds: float = Field(default=30.0, gt=0)


class UpkeepResult(BaseModel):
    requeued: int = 0
    dead_lettered: int = 0
    retried: int = 0
    events_pruned: int = 0
    todos_pruned: int = 0


class LoadRerouteInput(BaseModel):
    """One original event of a bulk re-route, and what its RouteDelivery input needs besides the stored row."""

    webhook_id: str
    event_id: str
    batch: str
    evaluate_queue_seconds: float = 120.0


class LoadRerouteResult(BaseModel):
    """The re-route's RouteDelivery input, or None when retention pruned the event since it was chosen."""

    delivery: DeliveryInput | None = None


class EvaluateHereInput(BaseModel):
    """RouteDelivery's fast path: its rules on its envelope, and the endpoint whose capacity it would take."""

    rules: EvaluateInput
    endpoint_id: str


class QueuedEvaluateInput(BaseModel):
    """RouteDelivery's evaluation on the fair evaluate queue: its rules, built into an envelope from the delivery."""

    delivery: DeliveryInput
    rules: list[dict[str, Any]]
    params: dict[str, Any] | None = None
    # The webhook's trust gate, so .actor's flags read as on the run's own envelope.
    trusted_actors: dict[str, Any] | None = None


class EvaluateHereResult(BaseModel):
    """Whether this worker took the evaluation (a free sandbox child, nobody waiting), and then its verdict."""

    admitted: bool
    evaluation: Evaluation | None = None
