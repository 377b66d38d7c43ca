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
        ids["ReapTodos"]: reaper_schedule(ids["ReapTodos"], task_queue),
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


# Lease reaper and due retries: one run an hour that reaps every 30 s (ReapTodos loops on durable timers),
# so reaps keep their 30 s pace while the workflow list gains 24 runs a day instead of 2,880.
REAP_EVERY = timedelta(seconds=30)
REAPER_RUN_EVERY = timedelta(hours=1)


def reaper_schedule(schedule_id: str, task_queue: str) -> Schedule:
    """The reaper's schedule: hourly runs of ReapTodos, each reaping every 30 s for the hour."""
    rounds = int(REAPER_RUN_EVERY / REAP_EVERY)
    data = UpkeepInput(rounds=rounds, every_seconds=REAP_EVERY.total_seconds())
    return Schedule(
        action=ScheduleActionStartWorkflow("ReapTodos", data, id=f"{schedule_id}-run", task_queue=task_queue),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=REAPER_RUN_EVERY)]),
        # The run ends one round before the hour; a run still going when the next start is due (a slow worker)
        # is followed straight away instead of skipped, so there is never an hour without reaps. A start
        # missed while the server was down is taken when it is back, within the hour.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.BUFFER_ONE, catchup_window=REAPER_RUN_EVERY),
    )
