"""Periodic upkeep: lease reaper, due retries and retention."""

from __future__ import annotations

from temporalio import activity

from activities.models import UpkeepInput, UpkeepResult
from store.todos import TodoStore


class UpkeepActivities:
    """Constructed once in the worker."""

    def __init__(self, todos: TodoStore) -> None:
        self.todos = todos

    @activity.defn(name="reap_todos")
    async def reap_todos(self, data: UpkeepInput) -> UpkeepResult:
        """Expired leases back to pending or dead letter; due retries back to pending."""
        counts = await self.todos.reap()
        return UpkeepResult(**counts)
