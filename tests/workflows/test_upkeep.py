"""Upkeep: retention prunes only what is finished and old; both upkeep schedules exist after a worker starts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from temporalio.client import (
    Client,
    ScheduleActionStartWorkflow,
    ScheduleOverlapPolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from activities.models import UpkeepInput, UpkeepResult
from runtime.schedules import ensure_schedules, schedule_ids
from tests.conftest import Stack, make_settings
from tests.helpers import eventually
from worker import running_worker
from workflows.upkeep import PruneRetention, ReapTodos

OLD = timedelta(days=40)
YOUNG = timedelta(days=5)


def _todo(stack: Stack, name: str, state: str, age: timedelta, **cols: Any) -> str:
    """A todo row last touched `age` ago (and finished then, for done rows)."""
    at = datetime.now(UTC) - age
    todo_id = f"td_{name}"
    stack.sql(
        "INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key, state, created_at, updated_at,"
        " completed_at, next_retry_at, lease_expires_at, owner)"
        " VALUES (%s, 'ep_x', 'work', 'github', %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        todo_id,
        name,
        f"wh_x:{name}",
        state,
        at,
        at,
        cols.get("completed_at"),
        cols.get("next_retry_at"),
        cols.get("lease_expires_at"),
        cols.get("owner"),
    )
    return todo_id


def _event(stack: Stack, name: str, age: timedelta) -> str:
    event_id = f"ev_{name}"
    stack.sql(
        "INSERT INTO events (id, webhook_id, endpoint_id, source, external_id, trust_mode, verified, payload,"
        " payload_size, received_at, routing_trace, disposition)"
        " VALUES (%s, 'wh_x', 'ep_x', 'github', %s, 'signed', true, %s, 2, %s, %s, 'routed')",
        event_id,
        f"wh_x:{name}",
        b"{}",
        datetime.now(UTC) - age,
        Jsonb({"stage": "default"}),
    )
    return event_id


def _seed(stack: Stack) -> None:
    long_ago = datetime.now(UTC) - OLD
    _todo(stack, "done_old", "done", OLD, completed_at=long_ago)
    _todo(stack, "canceled_old", "canceled", OLD)
    _todo(stack, "dead_old", "failed", OLD)
    _todo(stack, "done_young", "done", YOUNG, completed_at=datetime.now(UTC) - YOUNG)
    # Live work is never pruned, however old: pending, claimed (even with a long-expired lease), parked retries.
    _todo(stack, "pending_old", "pending", OLD)
    _todo(stack, "claimed_old", "claimed", OLD, lease_expires_at=long_ago, owner="agent:ag_x")
    _todo(stack, "parked_old", "failed", OLD, next_retry_at=long_ago)
    _event(stack, "old", OLD)
    _event(stack, "young", YOUNG)
    stack.sql(
        "INSERT INTO routing_once (webhook_id, once_key, event_id, claimed_at) VALUES ('wh_x', 'k', 'ev_old', %s)",
        long_ago,
    )


def _remaining(stack: Stack) -> tuple[list[str], list[str], int]:
    todos = [r[0] for r in stack.sql("SELECT id FROM todos ORDER BY id")]
    events = [r[0] for r in stack.sql("SELECT id FROM events ORDER BY id")]
    return todos, events, stack.sql("SELECT count(*) FROM routing_once")[0][0]


KEPT = (
    ["td_claimed_old", "td_done_young", "td_parked_old", "td_pending_old"],
    ["ev_young"],
    1,
)


async def _prune(stack: Stack) -> UpkeepResult:
    return await stack.temporal.execute_workflow(
        PruneRetention.run,
        UpkeepInput(),
        id=f"prune-{uuid.uuid4().hex[:8]}",
        task_queue=stack.settings.task_queue,
    )


async def test_retention_prunes_old_terminal_todos_and_events_only(stack: Stack) -> None:
    _seed(stack)
    first = await _prune(stack)
    assert (first.todos_pruned, first.events_pruned) == (3, 1)
    assert _remaining(stack) == KEPT
    # Running again (or overlapping) is harmless: nothing new is old enough.
    again = await _prune(stack)
    assert (again.todos_pruned, again.events_pruned) == (0, 0)
    assert _remaining(stack) == KEPT


async def test_retention_leaves_live_deliveries_alone(stack: Stack) -> None:
    from tests.helpers import issue_payload, post_github

    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    assert resp.status_code == 202
    todo_id = resp.json()["todos"][0]["id"]
    await agent.ok("claim", {"todo_id": todo_id})
    await agent.ok("complete", {"todo_id": todo_id})
    result = await _prune(stack)
    assert (result.todos_pruned, result.events_pruned) == (0, 0)
    assert (await agent.ok("list_webhook_events", {}))["events"][0]["todo_ids"] == [todo_id]


async def test_upkeep_workflows_replay(stack: Stack) -> None:
    handle = await stack.temporal.start_workflow(
        PruneRetention.run, UpkeepInput(), id=f"prune-{uuid.uuid4().hex[:8]}", task_queue=stack.settings.task_queue
    )
    await handle.result()
    reap = await stack.temporal.start_workflow(
        ReapTodos.run, UpkeepInput(), id=f"reap-{uuid.uuid4().hex[:8]}", task_queue=stack.settings.task_queue
    )
    await reap.result()
    replayer = Replayer(workflows=[ReapTodos, PruneRetention], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(await handle.fetch_history())
    await replayer.replay_workflow(await reap.fetch_history())


async def _delete_schedules(client: Client, task_queue: str) -> None:
    for schedule_id in schedule_ids(task_queue).values():
        try:
            await client.get_schedule_handle(schedule_id).delete()
        except RPCError:
            pass


async def test_worker_start_creates_both_upkeep_schedules_idempotently(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    client = temporal_env.client
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    settings = make_settings(tmp_path, database_url, client.service_client.config.target_host, task_queue)
    ids = schedule_ids(task_queue)
    try:
        async with running_worker(settings):
            # The reaper starts hourly, and each run reaps every 30 s (ReapTodos loops): same reap pace, 24 runs
            # a day in the workflow list instead of 2,880. A late run is followed at once, never skipped.
            expected = {
                ids["ReapTodos"]: ("ReapTodos", timedelta(hours=1), ScheduleOverlapPolicy.BUFFER_ONE),
                ids["PruneRetention"]: ("PruneRetention", timedelta(hours=1), ScheduleOverlapPolicy.SKIP),
            }
            for schedule_id, (workflow, every, overlap) in expected.items():
                desc = await client.get_schedule_handle(schedule_id).describe()
                action = desc.schedule.action
                assert isinstance(action, ScheduleActionStartWorkflow)
                assert action.workflow == workflow and action.task_queue == task_queue
                assert [i.every for i in desc.schedule.spec.intervals] == [every]
                assert desc.schedule.policy.overlap == overlap
            reaper = await client.get_schedule_handle(ids["ReapTodos"]).describe()
            assert isinstance(reaper.schedule.action, ScheduleActionStartWorkflow)
            (args,) = reaper.schedule.action.args
            data = pydantic_data_converter.payload_converter.from_payload(args, UpkeepInput)  # type: ignore[arg-type]
            assert data.rounds * data.every_seconds == 3600 and data.every_seconds == 30

            # A second start (another worker process, a restart) leaves the schedules as they are.
            await ensure_schedules(client, task_queue)
            await ensure_schedules(client, task_queue)
            for schedule_id, (workflow, _, _) in expected.items():
                desc = await client.get_schedule_handle(schedule_id).describe()
                assert isinstance(desc.schedule.action, ScheduleActionStartWorkflow)
                assert desc.schedule.action.workflow == workflow

            # The retention schedule drives the real workflow on this worker.
            stack = Stack(settings, None, client, database_url)  # type: ignore[arg-type]
            _seed(stack)
            await client.get_schedule_handle(ids["PruneRetention"]).trigger()

            async def pruned() -> bool:
                return _remaining(stack) == KEPT

            await eventually(pruned)
    finally:
        await _delete_schedules(client, task_queue)


async def test_a_looping_reaper_run_reaps_every_round_and_replays(stack: Stack) -> None:
    """One ReapTodos run reaps each round: a lease that expires after its first reap is requeued by a later one."""
    handle = await stack.temporal.start_workflow(
        ReapTodos.run,
        UpkeepInput(rounds=4, every_seconds=1.0),
        id=f"reap-loop-{uuid.uuid4().hex[:8]}",
        task_queue=stack.settings.task_queue,
    )

    async def first_reap_done() -> bool:
        history = await handle.fetch_history()
        return any(e.HasField("activity_task_completed_event_attributes") for e in history.events)

    await eventually(first_reap_done)
    expired = datetime.now(UTC) - timedelta(minutes=5)
    _todo(stack, "lease_lapsed", "claimed", timedelta(minutes=10), lease_expires_at=expired, owner="agent:ag_x")
    result = await handle.result()
    assert result.requeued == 1
    assert stack.sql("SELECT state, owner FROM todos WHERE id = 'td_lease_lapsed'") == [("pending", None)]
    history = await handle.fetch_history()
    reaps = [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    assert len(reaps) == 4
    replayer = Replayer(workflows=[ReapTodos], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
