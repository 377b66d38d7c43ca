"""Upkeep workflows, each started by a Temporal Schedule so operators see and pause them in the UI."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.models import UpkeepInput, UpkeepResult
    from activities.upkeep import UpkeepActivities


@workflow.defn(name="ReapTodos")
class ReapTodos:
    """Requeue expired leases and due retries; idempotent, so overlapping or repeated runs are harmless.

    One run reaps ``data.rounds`` times, ``data.every_seconds`` apart (durable timers), so the reaper keeps its
    30 s pace while the workflow list shows one run an hour rather than one per reap.
    """

    @workflow.run
    async def run(self, data: UpkeepInput) -> UpkeepResult:
        if data.rounds == 1:
            # One reap, exactly the commands runs recorded before the loop made (they replay unchanged).
            return await self._reap(data)
        total = UpkeepResult()
        failed = 0
        for round_no in range(data.rounds):
            if round_no:
                await workflow.sleep(timedelta(seconds=data.every_seconds), summary="until the next reap")
            try:
                result = await self._reap(data)
            except ActivityError as err:
                # One reap failed its attempts: the next round tries again in every_seconds; the run goes on
                # rather than leaving leases unreaped until the schedule's next start.
                failed += 1
                workflow.logger.warning("reap %d of %d failed: %s", round_no + 1, data.rounds, err.cause or err)
                continue
            total = UpkeepResult(
                requeued=total.requeued + result.requeued,
                dead_lettered=total.dead_lettered + result.dead_lettered,
                retried=total.retried + result.retried,
            )
            workflow.set_current_details(_reap_details(round_no + 1, data.rounds, total, failed))
        if failed == data.rounds:
            raise ApplicationError(f"every reap of this run failed ({failed})", non_retryable=True)
        return total

    async def _reap(self, data: UpkeepInput) -> UpkeepResult:
        return await workflow.execute_activity_method(
            UpkeepActivities.reap_todos,
            data,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )


def _reap_details(done: int, rounds: int, total: UpkeepResult, failed: int) -> str:
    """The reaper run's progress for the UI."""
    lines = [
        f"**reaps** {done} of {rounds}" + (f" ({failed} failed)" if failed else ""),
        f"**requeued** {total.requeued} · **dead-lettered** {total.dead_lettered} · **retried** {total.retried}",
    ]
    return "\n\n".join(lines)


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
