"""Temporal client construction and the schedules Switchboard keeps in the namespace."""

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
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.models import UpkeepInput
from switchboard.settings import Settings

log = logging.getLogger("switchboard.temporal")

REAPER_SCHEDULE_ID = "switchboard-reaper"


async def connect(settings: Settings, address: str | None = None, *, lazy: bool = False) -> Client:
    """A client with the pydantic data converter, so models cross the wire as JSON."""
    target = address or settings.temporal_address
    if not target:
        raise RuntimeError("SWITCHBOARD_TEMPORAL_ADDRESS is not set")
    return await Client.connect(
        target, namespace=settings.temporal_namespace, data_converter=pydantic_data_converter, lazy=lazy
    )


async def ensure_schedules(client: Client, task_queue: str) -> None:
    """Create the upkeep schedules once; an existing schedule is left as the operator configured it."""
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            "ReapTodos", UpkeepInput(), id=f"{REAPER_SCHEDULE_ID}-run", task_queue=task_queue
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=30))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=timedelta(minutes=1)),
    )
    try:
        await client.create_schedule(REAPER_SCHEDULE_ID + "-" + task_queue, schedule)
        log.info("created schedule %s", REAPER_SCHEDULE_ID)
    except ScheduleAlreadyRunningError:
        pass
