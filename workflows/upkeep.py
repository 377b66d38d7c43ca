"""Upkeep workflows, each started by a Temporal Schedule so operators see and pause them in the UI."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.models import UpkeepInput, UpkeepResult
    from activities.upkeep import UpkeepActivities


@workflow.defn(name="ReapTodos")
class ReapTodos:
    """Requeue expired leases and due retries; idempotent, so overlapping or repeated runs are harmless."""

    @workflow.run
    async def run(self, data: UpkeepInput) -> UpkeepResult:
        return await workflow.execute_activity_method(
            UpkeepActivities.reap_todos,
            data,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )


@workflow.defn(name="PruneRetention")
class PruneRetention:
    """Delete events and terminal todos past retention; idempotent, so a repeated run deletes nothing new."""

    @workflow.run
    async def run(self, data: UpkeepInput) -> UpkeepResult:
        return await workflow.execute_activity_method(
            UpkeepActivities.prune_retention,
            data,
            start_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
