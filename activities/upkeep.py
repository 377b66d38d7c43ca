"""Periodic upkeep: lease reaper, due retries and retention."""

from __future__ import annotations

from temporalio import activity

from activities.errors import application_errors
from activities.models import UpkeepInput, UpkeepResult
from store.events import EventStore
from store.todos import TodoStore
from switchboard.metrics import DEAD_LETTERS, LEASE_EXPIRIES


class UpkeepActivities:
    """Constructed once in the worker."""

    def __init__(self, todos: TodoStore, events: EventStore) -> None:
        self.todos = todos
        self.events = events

    @activity.defn(name="reap_todos")
    @application_errors
    async def reap_todos(self, data: UpkeepInput) -> UpkeepResult:
        """Expired leases back to pending or dead letter; due retries back to pending."""
        counts = await self.todos.reap()
        LEASE_EXPIRIES.inc(counts["requeued"] + counts["dead_lettered"])
        DEAD_LETTERS.labels(cause="lease_expired").inc(counts["dead_lettered"])
        return UpkeepResult(**counts)

    @activity.defn(name="prune_retention")
    @application_errors
    async def prune_retention(self, data: UpkeepInput) -> UpkeepResult:
        """Events and terminal todos older than the retention window; live work and once-claims stay."""
        counts = await self.events.prune(data.retention_days)
        return UpkeepResult(**counts)
