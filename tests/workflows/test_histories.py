"""A committed replay history for every workflow path, and the test that replays them all with today's code.

Each ``test_record_*`` drives one path through the real stack (receiver, worker, PostgreSQL, Temporal), checks
that the run took that path, replays the run's history, and keeps it as ``histories/<file>`` when recording
(``make histories``; see tests/workflows/replay.py). ``PATHS`` names the file of each path, so a path whose
history goes missing fails ``test_every_workflow_path_has_a_committed_history``.
How to change workflow code against these pins: docs/workflows.md.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from psycopg.types.json import Jsonb
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.models import UpkeepInput, UpkeepResult
from activities.schedules import FireInput, FireResult, fire_delivery_id
from routing.delivery import CommitResult, DeliveryInput
from routing.reroute import RerouteEventsInput, RerouteProgress
from store.db import open_pool
from tests.conftest import Agent, Stack, running_stack
from tests.helpers import NoFreeChild, issue_payload, post_github
from tests.workflows.replay import (
    HISTORIES,
    committed,
    committed_names,
    decision_attribute,
    handle_for,
    replay_and_keep,
    replayer,
)
from worker import build_worker
from workflows.reroute import RerouteEvents, batch_workflow_id, reroute_workflow_id
from workflows.route_delivery import RouteDelivery
from workflows.schedules import FireSchedule, fire_workflow_id
from workflows.upkeep import PruneRetention, ReapTodos

# Workflow path → its committed history (docs/workflows.md says when a path is re-recorded).
PATHS = {
    "RouteDelivery: no rules, the target queue (default)": "route_delivery_default.json",
    "RouteDelivery: a rule matches (a free sandbox child on the run's worker)": "route_delivery_rules.json",
    "RouteDelivery: a rule matches (no free child: the fair evaluate queue)": "route_delivery_rules_overflow.json",
    "RouteDelivery: a rule drops": "route_delivery_drop.json",
    "RouteDelivery: a redelivery of a committed delivery": "route_delivery_redelivery.json",
    "RouteDelivery: a once-key already claimed (repeat)": "route_delivery_once_repeat.json",
    "RouteDelivery: the webhook was deleted before the run (gone)": "route_delivery_gone.json",
    "RouteDelivery: no live target (no_targets)": "route_delivery_no_targets.json",
    "RouteDelivery: a rule faults under on_fault hold": "route_delivery_on_fault_hold.json",
    "RouteDelivery: no evaluate worker starts the rules (sandbox_busy)": "route_delivery_evaluate_not_started.json",
    "RouteDelivery: every evaluation attempt fails (sandbox_failure)": "route_delivery_evaluate_failed.json",
    "RouteDelivery: the commit is refused, stored as faulted": "route_delivery_commit_faulted.json",
    "RouteDelivery: even the faulted row is refused": "route_delivery_commit_refused_twice.json",
    # Recorded by tests/api/test_llm_triage.py (`make histories` runs it too).
    "RouteDelivery: no rule matched, LLM triage chooses a queue": "route_delivery_llm_triage.json",
    "RouteDelivery: no rule matched, LLM triage declines (the default)": "route_delivery_llm_default.json",
    "FireSchedule: a fire routed by its child RouteDelivery": "fire_schedule.json",
    "FireSchedule: the child RouteDelivery of a fire": "fire_schedule_child.json",
    "FireSchedule: a later fire of the same slot (duplicate)": "fire_schedule_duplicate.json",
    "FireSchedule: another fire of the slot is routing it (joined)": "fire_schedule_joined.json",
    "FireSchedule: the schedule was deleted (gone)": "fire_schedule_gone.json",
    "RouteDelivery: a re-route of a stored event (reroute_webhook_event)": "route_delivery_reroute.json",
    "RouteDelivery: the trust gate quarantines an untrusted sender (no rule evaluated)": "route_delivery_trust_gate.json",
    "RouteDelivery: a rule quarantines": "route_delivery_quarantine.json",
    "RouteDelivery: the release of a quarantined event (release_webhook_event)": "route_delivery_release.json",
    "RerouteEvents: the run that continues as new after per_run deliveries": "reroute_events_first_run.json",
    "RerouteEvents: the last run, one delivery pruned since the plan (missing)": "reroute_events.json",
    "RerouteEvents: the child RouteDelivery of one delivery": "reroute_events_child.json",
    "ReapTodos: expired leases and due retries requeued": "reap_todos.json",
    "PruneRetention: old events and terminal todos deleted": "prune_retention.json",
    # Recorded by tests/workflows/test_reconcile.py.
    "ReconcileWebhook: missing deliveries found and redelivered": "reconcile_webhook.json",
    "ReconcileWebhook: GitHub's rate limit waited out with a timer": "reconcile_webhook_rate_limited.json",
    "ReconcileWebhook: GitHub refuses the token (unauthorized)": "reconcile_webhook_unauthorized.json",
    "ReconcileWebhook: the webhook is gone (no call to GitHub)": "reconcile_webhook_gone.json",
}


def test_every_workflow_path_has_a_committed_history() -> None:
    missing = [f"{path} ({name})" for path, name in PATHS.items() if not (HISTORIES / name).exists()]
    assert not missing, f"record with `make histories`: {missing}"


@pytest.mark.parametrize("name", committed_names())
async def test_committed_histories_still_replay(name: str) -> None:
    await replayer().replay_workflow(committed(name))


# RouteDelivery ------------------------------------------------------------------------------------------------


ISSUES_RULE = {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}


async def _webhook(agent: Agent, rules: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    if rules is not None:
        await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules, **extra})
    return webhook


async def _deliver(stack: Stack, webhook: dict[str, Any], delivery: str, **payload: Any) -> dict[str, Any]:
    resp = await post_github(stack.http, webhook, issue_payload(**payload), delivery=delivery)
    assert resp.status_code == 202, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def _kept(stack: Stack, webhook: dict[str, Any], delivery: str, name: str, decision: str) -> CommitResult:
    """The run's result after checking its outcome attribute, its history replayed and kept."""
    handle = handle_for(stack, webhook["webhook_id"], delivery)
    result = await handle.result()
    assert await decision_attribute(handle) == decision
    await replay_and_keep(handle, name)
    return result


async def test_record_rule_match_on_a_free_child(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent, [ISSUES_RULE])
    await _deliver(stack, hook, "first-1")
    path = PATHS["RouteDelivery: a rule matches (a free sandbox child on the run's worker)"]
    result = await _kept(stack, hook, "first-1", path, "routed")
    assert result.created == 1 and result.rule_id == "issues"
    history = await handle_for(stack, hook["webhook_id"], "first-1").fetch_history()
    assert not [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]
    # No patch markers, and the run's one upsert is its decision's (no TemporalChangeVersion).
    assert not [
        e
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    [upsert] = [e for e in history.events if e.HasField("upsert_workflow_search_attributes_event_attributes")]
    fields = upsert.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    assert "TemporalChangeVersion" not in fields and "SwitchboardDecision" in fields


async def test_record_rule_match_overflowing_to_the_fair_queue(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, NoFreeChild(sandbox)) as stack:
        agent = await stack.agent()
        hook = await _webhook(agent, [ISSUES_RULE])
        await _deliver(stack, hook, "overflow-1")
        path = PATHS["RouteDelivery: a rule matches (no free child: the fair evaluate queue)"]
        result = await _kept(stack, hook, "overflow-1", path, "routed")
        assert result.created == 1 and result.rule_id == "issues"
        history = await handle_for(stack, hook["webhook_id"], "overflow-1").fetch_history()
        [scheduled] = [
            e.activity_task_scheduled_event_attributes
            for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")
        ]
        # The evaluate queue, the owning endpoint as fairness key, and queueing bounded apart from running.
        assert scheduled.task_queue.name == f"{stack.settings.task_queue}-evaluate"
        assert scheduled.priority.fairness_key == agent.endpoint_id
        assert scheduled.schedule_to_start_timeout.ToSeconds() == stack.settings.evaluate_queue_seconds
        assert scheduled.heartbeat_timeout.ToSeconds() == 3


async def test_record_default_without_rules(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent)
    await _deliver(stack, hook, "default-1")
    result = await _kept(
        stack, hook, "default-1", PATHS["RouteDelivery: no rules, the target queue (default)"], "routed"
    )
    assert result.created == 1 and result.rule_id is None


async def test_record_drop(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent, [{"id": "mute", "expr": "true", "action": {"drop": True}}])
    await _deliver(stack, hook, "drop-1")
    result = await _kept(stack, hook, "drop-1", PATHS["RouteDelivery: a rule drops"], "dropped")
    assert result.dropped and result.created == 0 and result.rule_id == "mute"


async def test_record_redelivery(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent)
    first = await _deliver(stack, hook, "again-1")
    again = await _deliver(stack, hook, "again-1")
    assert again["duplicate"] is True and again["event_id"] == first["event_id"]
    # The redelivery is a second run of the same workflow id; the handle follows the latest run.
    result = await _kept(
        stack, hook, "again-1", PATHS["RouteDelivery: a redelivery of a committed delivery"], "routed_duplicate"
    )
    assert result.duplicate and result.created == 0


async def test_record_once_repeat(stack: Stack) -> None:
    agent = await stack.agent()
    lane = {"id": "lane", "expr": ".issue != null", "action": {"queue": "work", "exclusive": True, "once": True}}
    hook = await _webhook(agent, [lane])
    first = await _deliver(stack, hook, "once-1")
    assert first["created"] == 1
    # Another delivery about the same issue: its once-key is already claimed.
    await _deliver(stack, hook, "once-2", action="edited")
    result = await _kept(stack, hook, "once-2", PATHS["RouteDelivery: a once-key already claimed (repeat)"], "repeat")
    assert result.repeat and result.created == 0 and result.rule_id == "lane"


async def _run_worker_until(stack: Stack, database_url: str, sandbox: Any, handle: WorkflowHandle[Any, Any]) -> Any:
    pool = await open_pool(database_url, max_size=4)
    try:
        async with build_worker(stack.temporal, pool, stack.settings, sandbox=sandbox):
            return await handle.result()
    finally:
        await pool.close()


async def test_record_gone(tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 0.5
        agent = await stack.agent()
        hook = await _webhook(agent)
        assert (await _deliver(stack, hook, "gone-1"))["pending"] is True
        # The run waits for a worker while its webhook is deleted: it loads no grant.
        await agent.ok("delete_webhook", {"webhook_id": hook["webhook_id"]})
        handle = handle_for(stack, hook["webhook_id"], "gone-1")
        result = await _run_worker_until(stack, database_url, sandbox, handle)
        assert result.status == "gone" and result.event_id is None
        assert await decision_attribute(handle) == "gone"
        # Deleted or not, the run still names its sender with the decision (the start sets no attributes).
        attrs = {k.name: v for k, v in (await handle.describe()).typed_search_attributes}
        assert attrs["SwitchboardWebhookId"] == hook["webhook_id"] and attrs["SwitchboardSource"] == "github"
        assert attrs["SwitchboardDeliveryId"] == "gone-1"
        await replay_and_keep(handle, PATHS["RouteDelivery: the webhook was deleted before the run (gone)"])


async def test_record_no_targets(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 0.5
        agent = await stack.agent()
        hook = await _webhook(agent)
        assert (await _deliver(stack, hook, "none-1"))["pending"] is True
        # The owning endpoint is revoked while the run waits: the webhook is live but nothing may receive it.
        await stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
        handle = handle_for(stack, hook["webhook_id"], "none-1")
        result = await _run_worker_until(stack, database_url, sandbox, handle)
        assert result.status == "no_targets" and result.event_id is None
        assert await decision_attribute(handle) == "no_targets"
        await replay_and_keep(handle, PATHS["RouteDelivery: no live target (no_targets)"])


async def test_record_hold_on_fault(stack: Stack) -> None:
    agent = await stack.agent()
    boom = {"id": "boom", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}
    hook = await _webhook(agent, [boom], on_fault="hold")
    await _deliver(stack, hook, "held-1")
    result = await _kept(stack, hook, "held-1", PATHS["RouteDelivery: a rule faults under on_fault hold"], "faulted")
    assert result.faulted and result.created == 0
    [(trace,)] = stack.sql("SELECT routing_trace FROM events WHERE id = %s", result.event_id)
    assert trace["cause"] == "held_on_fault"


async def test_record_evaluation_no_worker_starts(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        stack.settings.evaluate_queue_seconds = 1.0
        agent = await stack.agent()
        hook = await _webhook(agent, [ISSUES_RULE])
        pool = await open_pool(database_url, max_size=4)
        try:
            # Only the workflow worker runs, its children all busy: nothing polls the evaluate queue.
            async with build_worker(stack.temporal, pool, stack.settings, sandbox=cast(Any, NoFreeChild(sandbox))).main:
                await _deliver(stack, hook, "stuck-1")
                handle = handle_for(stack, hook["webhook_id"], "stuck-1")
                result = await handle.result()
        finally:
            await pool.close()
        assert result.disposition == "routed" and result.rule_id is None  # on_fault continue: the default
        [(trace,)] = stack.sql("SELECT routing_trace FROM events WHERE id = %s", result.event_id)
        assert [f["cause"] for f in trace["faults"]] == ["sandbox_busy"]
        await replay_and_keep(handle, PATHS["RouteDelivery: no evaluate worker starts the rules (sandbox_busy)"])


class _BrokenSandbox:
    """A sandbox whose every evaluation raises: each attempt of the evaluate activity fails (it has no fast path,
    so every run overflows to the evaluate queue)."""

    slots = 2

    async def evaluate(self, *_: Any) -> Any:
        raise RuntimeError("sandbox exploded")


async def test_record_evaluation_fails_every_attempt(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, _BrokenSandbox()) as stack:
        agent = await stack.agent()
        hook = await _webhook(agent, [ISSUES_RULE])
        await _deliver(stack, hook, "broken-1")
        result = await _kept(
            stack, hook, "broken-1", PATHS["RouteDelivery: every evaluation attempt fails (sandbox_failure)"], "routed"
        )
        [(trace,)] = stack.sql("SELECT routing_trace FROM events WHERE id = %s", result.event_id)
        assert [f["cause"] for f in trace["faults"]] == ["sandbox_failure"]


# Re-routes ---------------------------------------------------------------------------------------------------


MUTE = {"id": "mute", "expr": "true", "action": {"drop": True}}


async def test_record_reroute_of_one_event(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent, [MUTE])
    dropped = await _deliver(stack, hook, "reroute-1")
    await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": []})
    out = await agent.ok("reroute_webhook_event", {"event_id": dropped["event_id"], "wait_seconds": 30})
    assert out["result"]["created"] == 1
    handle = stack.temporal.get_workflow_handle(out["workflow_id"])
    assert await decision_attribute(handle) == "routed"
    await replay_and_keep(handle, PATHS["RouteDelivery: a re-route of a stored event (reroute_webhook_event)"])


# The trust gate, quarantine and release ----------------------------------------------------------------------


GATE = {"logins": ["maintainer"], "match": "both"}


def _local_activities(history: Any) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    )


async def test_record_trust_gate(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work", "trusted_actors": GATE})
    await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": [ISSUES_RULE]})
    # issue_payload's issue and sender are joestump's, whom the gate does not list.
    held = await _deliver(stack, hook, "gate-1")
    assert held["quarantined"] is True
    path = PATHS["RouteDelivery: the trust gate quarantines an untrusted sender (no rule evaluated)"]
    result = await _kept(stack, hook, "gate-1", path, "quarantined")
    assert result.quarantined and result.quarantine_reason == "untrusted_actor" and result.created == 0
    # load_grant and the commit only: no evaluation ran, on this worker or the evaluate queue.
    history = await handle_for(stack, hook["webhook_id"], "gate-1").fetch_history()
    assert _local_activities(history) == 2
    assert not [e for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]


async def test_record_quarantine_by_a_rule(stack: Stack) -> None:
    agent = await stack.agent()
    hold = {"id": "hold", "expr": ".issue != null", "action": {"quarantine": True}}
    hook = await _webhook(agent, [hold])
    await _deliver(stack, hook, "hold-1")
    result = await _kept(stack, hook, "hold-1", PATHS["RouteDelivery: a rule quarantines"], "quarantined")
    assert result.quarantined and result.rule_id == "hold" and result.quarantine_reason == "rule_action"


async def test_record_release(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work", "trusted_actors": GATE})
    released = {"id": "released", "expr": ".release != null", "action": {"queue": "work"}}
    await agent.ok(
        "set_webhook_rules",
        {"webhook_id": hook["webhook_id"], "rules": [released], "default_action": {"drop": True}},
    )
    held = await _deliver(stack, hook, "release-1")
    out = await agent.ok("release_webhook_event", {"event_id": held["event_id"], "wait_seconds": 30})
    assert out["result"]["created"] == 1
    handle = stack.temporal.get_workflow_handle(out["workflow_id"])
    assert await decision_attribute(handle) == "routed"
    await replay_and_keep(handle, PATHS["RouteDelivery: the release of a quarantined event (release_webhook_event)"])


async def test_record_bulk_reroute_continued_as_new(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await _webhook(agent, [MUTE])
    wid = hook["webhook_id"]
    events = [(await _deliver(stack, hook, f"bulk-{i}"))["event_id"] for i in range(4)]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": []})
    stack.sql("DELETE FROM events WHERE id = %s", events[1])  # pruned between the plan and its turn
    nonce = uuid.uuid4().hex[:16]
    handle: WorkflowHandle[Any, RerouteProgress] = await stack.temporal.start_workflow(
        RerouteEvents.run,
        RerouteEventsInput(webhook_id=wid, event_ids=events, batch=nonce, per_run=2, starts_per_second=2),
        id=batch_workflow_id(wid),
        task_queue=stack.settings.task_queue,
    )
    result = await handle.result()
    assert (result.done, result.created, result.failed) == (4, 3, 0)
    assert [r.status for r in result.results] == ["committed", "missing", "committed", "committed"]
    first = stack.temporal.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    assert (await first.describe()).status is not None
    await replay_and_keep(first, PATHS["RerouteEvents: the run that continues as new after per_run deliveries"])
    last = stack.temporal.get_workflow_handle(handle.id)
    await replay_and_keep(last, PATHS["RerouteEvents: the last run, one delivery pruned since the plan (missing)"])
    child = stack.temporal.get_workflow_handle(reroute_workflow_id(events[3], nonce))
    assert await decision_attribute(child) == "routed"
    await replay_and_keep(child, PATHS["RerouteEvents: the child RouteDelivery of one delivery"])


# FireSchedule --------------------------------------------------------------------------------------------------


async def _fire(stack: Stack, schedule_id: str, slot: str | None, workflow_id: str) -> FireResult:
    return await stack.temporal.execute_workflow(
        FireSchedule.run,
        FireInput(schedule_id=schedule_id, scheduled_time=slot),
        id=workflow_id,
        task_queue=stack.settings.task_queue,
    )


async def _schedule(stack: Stack) -> str:
    agent = await stack.agent(queues=["cron"])
    made = await agent.ok("create_schedule", {"cron": "0 0 1 1 *", "title": "Daily triage", "queue": "cron"})
    return str(made["schedule_id"])


async def test_record_fire_with_its_child_and_a_duplicate(stack: Stack) -> None:
    schedule_id = await _schedule(stack)
    fire_id = f"fire-{uuid.uuid4().hex[:8]}"
    # No pinned slot: the fire derives it from its start time, as a run started by the Temporal Schedule does.
    fired = await _fire(stack, schedule_id, None, fire_id)
    assert fired.status == "committed" and fired.created == 1 and fired.workflow_id
    assert stack.sql("SELECT fire_count FROM schedules WHERE id = %s", schedule_id) == [(1,)]
    await replay_and_keep(
        stack.temporal.get_workflow_handle(fire_id), PATHS["FireSchedule: a fire routed by its child RouteDelivery"]
    )
    child = stack.temporal.get_workflow_handle(fired.workflow_id)
    assert await decision_attribute(child) == "routed"
    await replay_and_keep(child, PATHS["FireSchedule: the child RouteDelivery of a fire"])

    late_id = f"late-{uuid.uuid4().hex[:8]}"
    late = await _fire(stack, schedule_id, fired.slot, late_id)
    assert late.status == "committed" and late.duplicate and late.created == 0
    await replay_and_keep(
        stack.temporal.get_workflow_handle(late_id), PATHS["FireSchedule: a later fire of the same slot (duplicate)"]
    )


async def test_record_fire_joining_a_running_child(stack: Stack) -> None:
    schedule_id = await _schedule(stack)
    slot = "2030-01-01T09:00:00Z"
    [(webhook_id, endpoint_id)] = stack.sql("SELECT webhook_id, endpoint_id FROM schedules WHERE id = %s", schedule_id)
    external_id = f"{webhook_id}:{fire_delivery_id(schedule_id, slot)}"
    # Another fire's child for this slot, still running: started on a task queue no worker polls.
    blocker = await stack.temporal.start_workflow(
        RouteDelivery.run,
        DeliveryInput(
            webhook_id=webhook_id,
            endpoint_id=endpoint_id,
            source="schedule",
            kind="schedule.fired",
            external_id=external_id,
            trust_mode="internal",
            verified=True,
            verify_detail="schedule",
            content_type="application/json",
            headers={},
            body=b"{}",
            source_ip=None,
            received_at=datetime.now(UTC).isoformat(),
        ),
        id=fire_workflow_id(webhook_id, external_id),
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )
    try:
        fire_id = f"join-{uuid.uuid4().hex[:8]}"
        joined = await _fire(stack, schedule_id, slot, fire_id)
        assert joined.status == "joined" and joined.workflow_id == blocker.id and joined.created == 0
        await replay_and_keep(
            stack.temporal.get_workflow_handle(fire_id),
            PATHS["FireSchedule: another fire of the slot is routing it (joined)"],
        )
    finally:
        await blocker.terminate()


async def test_record_fire_of_a_deleted_schedule(stack: Stack) -> None:
    fire_id = f"gone-{uuid.uuid4().hex[:8]}"
    gone = await _fire(stack, "sch_deleted", "2030-01-01T09:00:00Z", fire_id)
    assert gone.status == "gone" and gone.workflow_id is None
    await replay_and_keep(
        stack.temporal.get_workflow_handle(fire_id), PATHS["FireSchedule: the schedule was deleted (gone)"]
    )


# Upkeep --------------------------------------------------------------------------------------------------------


def _todo(stack: Stack, name: str, state: str, age: timedelta, **cols: Any) -> None:
    at = datetime.now(UTC) - age
    stack.sql(
        "INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key, state, created_at, updated_at,"
        " completed_at, next_retry_at, lease_expires_at, owner)"
        " VALUES (%s, 'ep_x', 'work', 'github', %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        f"td_{name}",
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


async def _upkeep(stack: Stack, workflow: Any, name: str) -> UpkeepResult:
    handle = await stack.temporal.start_workflow(
        workflow, UpkeepInput(), id=f"upkeep-{uuid.uuid4().hex[:8]}", task_queue=stack.settings.task_queue
    )
    result: UpkeepResult = await handle.result()
    await replay_and_keep(handle, name)
    return result


async def test_record_reap_todos(stack: Stack) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    _todo(stack, "leased", "claimed", timedelta(hours=1), lease_expires_at=past, owner="agent:ag_x")
    _todo(stack, "parked", "failed", timedelta(hours=1), next_retry_at=past)
    result = await _upkeep(stack, ReapTodos.run, PATHS["ReapTodos: expired leases and due retries requeued"])
    assert (result.requeued, result.retried) == (1, 1)


async def test_record_prune_retention(stack: Stack) -> None:
    old = timedelta(days=40)
    _todo(stack, "done_old", "done", old, completed_at=datetime.now(UTC) - old)
    stack.sql(
        "INSERT INTO events (id, webhook_id, endpoint_id, source, external_id, trust_mode, verified, payload,"
        " payload_size, received_at, routing_trace, disposition)"
        " VALUES ('ev_old', 'wh_x', 'ep_x', 'github', 'wh_x:old', 'signed', true, '{}', 2, %s, %s, 'routed')",
        datetime.now(UTC) - old,
        Jsonb({"stage": "default"}),
    )
    result = await _upkeep(stack, PruneRetention.run, PATHS["PruneRetention: old events and terminal todos deleted"])
    assert (result.todos_pruned, result.events_pruned) == (1, 1)
