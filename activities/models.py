"""Inputs and results of the activities (one model each, so fields can be added later)."""

from __future__ import annotations

from pydantic import BaseModel

from routing.delivery import DeliveryInput
from routing.models import Grant


class LoadGrantInput(BaseModel):
    webhook_id: str


class LoadGrantResult(BaseModel):
    """The grant, or None when the webhook no longer exists."""

    grant: Grant | None = None


class UpkeepInput(BaseModel):
    retention_days: int = 30


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
    evaluate_locally: bool = False
    evaluate_queue_seconds: float = 120.0


class LoadRerouteResult(BaseModel):
    """The re-route's RouteDelivery input, or None when retention pruned the event since it was chosen."""

    delivery: DeliveryInput | None = None
