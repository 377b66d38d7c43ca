"""Activities of RerouteEvents: read a stored original and build its re-route's RouteDelivery input."""

from __future__ import annotations

from temporalio import activity

from activities.errors import application_errors
from activities.models import LoadRerouteInput, LoadRerouteResult
from routing.reroute import reroute_input
from store.events import EventStore


class RerouteActivities:
    """Constructed once in the worker with the event store."""

    def __init__(self, events: EventStore) -> None:
        self.events = events

    @activity.defn(name="load_reroute")
    @application_errors
    async def load_reroute(self, data: LoadRerouteInput) -> LoadRerouteResult:
        """The RouteDelivery input re-routing one original event of the webhook; None once it was pruned."""
        stored = await self.events.stored_delivery(data.webhook_id, data.event_id)
        if stored is None:
            return LoadRerouteResult()
        delivery = reroute_input(stored, data.batch, evaluate_queue_seconds=data.evaluate_queue_seconds)
        return LoadRerouteResult(delivery=delivery)
