"""The upkeep schedules Switchboard keeps in its Temporal namespace (lease reaper, retention)."""

from __future__ import annotations

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from activities.models import UpkeepInput

log = logging.getLogger("switchboard.temporal")

REAPER_SCHEDULE_ID = "switchboard-reaper"
RETENTION_SCHEDULE_ID = "switchboard-retention"


def schedule_ids(task_queue: str) -> dict[str, str]:
    """The schedule id of each upkeep workflow for one task queue."""
    return {
        "ReapTodos": f"{REAPER_SCHEDULE_ID}-{task_queue}",
        "PruneRetention": f"{RETENTION_SCHEDULE_ID}-{task_queue}",
    }


async def ensure_schedules(client: Client, task_queue: str) -> None:
    """Create the upkeep schedules once; an existing schedule is left as the operator configured it."""
    ids = schedule_ids(task_queue)
    schedules = {
        # Lease reaper and due retries.
        ids["ReapTodos"]: Schedule(
            action=ScheduleActionStartWorkflow(
                "ReapTodos", UpkeepInput(), id=f"{ids['ReapTodos']}-run", task_queue=task_queue
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=30))]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(minutes=1)),
        ),
        # Retention: events and terminal todos past 30 days.
        ids["PruneRetention"]: Schedule(
            action=ScheduleActionStartWorkflow(
                "PruneRetention", UpkeepInput(), id=f"{ids['PruneRetention']}-run", task_queue=task_queue
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=1))]),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(hours=1)),
        ),
    }
    for schedule_id, schedule in schedules.items():
        try:
            await client.create_schedule(schedule_id, schedule)
            log.info("created schedule %s", schedule_id)
        except ScheduleAlreadyRunningError:
            pass
