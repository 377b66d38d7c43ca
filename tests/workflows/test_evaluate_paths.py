"""Local first, fair overflow: where a delivery's rules are evaluated, and that each place keeps its guarantees.

A run evaluates in a local activity on a free sandbox child of its own worker; with no child free (or someone
already waiting for one) that activity answers "not admitted" at once and the run evaluates on the fair evaluate
queue. A worker killed mid local evaluation is noticed by the workflow task timeout, and the next worker
evaluates again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from routing.delivery import CommitResult
from routing.sandbox import SandboxPool
from store.db import open_pool
from tests.conftest import Stack, running_stack, worker_process_env
from tests.helpers import eventually, issue_payload, post_github
from tests.workflows.replay import handle_for, replayer
from worker import build_worker

RULES = [{"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}]
ENVELOPE = {"source": "github", "kind": "issues", "payload": {"n": 1}}


def evaluations(path: str) -> float:
    return REGISTRY.get_sample_value("switchboard_evaluations_total", {"path": path}) or 0.0


def scheduled(history: WorkflowHistory) -> list[Any]:
    """The run's regular activities (the fast path schedules none)."""
    return [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def deliver(stack: Stack, delivery: str) -> tuple[dict[str, Any], WorkflowHistory]:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
    resp = await post_github(stack.http, hook, issue_payload(), delivery=delivery)
    assert resp.status_code == 202, resp.text
    handle = handle_for(stack, hook["webhook_id"], delivery)
    result = await handle.result()
    assert result.created == 1 and result.rule_id == "issues"
    history = await handle.fetch_history()
    await replayer().replay_workflow(history)
    return hook, history


async def test_an_idle_worker_evaluates_on_its_own_free_child(stack: Stack) -> None:
    local, queued = evaluations("local"), evaluations("queue")
    _, history = await deliver(stack, "idle-1")
    assert scheduled(history) == []
    assert (evaluations("local"), evaluations("queue")) == (local + 1, queued)
    # The operator sees the path in the UI: the local activity's summary says where it evaluated.
    summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(b"on this worker, if a sandbox child is free" in s for s in summaries), summaries


async def test_no_free_child_overflows_to_the_fair_queue(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    pool = SandboxPool(max_children=1)
    try:
        async with running_stack(tmp_path, database_url, temporal_env.client, pool) as stack:
            agent = await stack.agent()
            hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
            await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
            local, queued = evaluations("local"), evaluations("queue")
            await pool._slots.acquire()  # the one child is busy (another delivery's evaluation)
            try:
                stack.settings.ingest_wait_seconds = 0.5
                resp = await post_github(stack.http, hook, issue_payload(), delivery="busy-1")
                assert resp.status_code == 202, resp.text
                handle = handle_for(stack, hook["webhook_id"], "busy-1")

                async def queued_on_evaluate() -> list[Any]:
                    return scheduled(await handle.fetch_history())

                # Not admitted at once: the evaluation waits on the fair queue (with its endpoint's fairness key).
                [attrs] = await eventually(queued_on_evaluate, timeout=60)
                assert attrs.task_queue.name == f"{stack.settings.task_queue}-evaluate"
                assert attrs.priority.fairness_key == agent.endpoint_id
            finally:
                pool._slots.release()
            result: CommitResult = await handle.result()
            assert result.created == 1 and result.rule_id == "issues"
            assert (evaluations("local"), evaluations("queue")) == (local, queued + 1)
            history = await handle.fetch_history()
            summaries = [e.user_metadata.summary.data for e in history.events if e.HasField("user_metadata")]
            assert any(b"on the fair queue (no sandbox child was free)" in s for s in summaries), summaries
            await replayer().replay_workflow(history)
    finally:
        await pool.close()


async def test_a_worker_killed_mid_local_evaluation_is_replaced_and_nothing_is_lost(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    client = temporal_env.client
    async with running_stack(tmp_path, database_url, client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 1.0
        agent = await stack.agent()
        hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": RULES})
        log = tmp_path / "worker.log"
        # The worker evaluates on the fast path (the default), then pauses before answering: it is killed there.
        env = worker_process_env(stack, tmp_path / "worker-home", SWITCHBOARD_FAULT_EVALUATE_DELAY="120")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "worker"], env=env, stdout=out, stderr=out, start_new_session=True
            )
        try:
            resp = await post_github(stack.http, hook, issue_payload(), delivery="killed-1")
            assert resp.status_code == 202 and resp.json()["pending"] is True
            workflow_id = resp.json()["workflow_id"]
            await eventually(lambda: b"fault injection: holding the local evaluation" in log.read_bytes(), timeout=60)
            assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed_at = time.monotonic()
        pool = await open_pool(database_url, max_size=4)
        try:
            async with build_worker(
                client, pool, stack.settings, task_queue=stack.settings.task_queue, sandbox=sandbox
            ):
                handle = client.get_workflow_handle(workflow_id, result_type=CommitResult)
                result = await handle.result()
                detected = time.monotonic() - killed_at
                print(f"\nkilled mid local evaluation: the next worker finished the delivery {detected:.1f} s later")
                assert result.created == 1 and result.rule_id == "issues"
                again = await post_github(stack.http, hook, issue_payload(), delivery="killed-1")
                assert again.json()["duplicate"] is True
        finally:
            await pool.close()
        assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
        assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1
        history = await handle.fetch_history()
        # The killed worker's workflow task timed out (the local path's dead-worker detection: the workflow task
        # timeout, 10 s by default) and the next worker evaluated the rules again on its own fast path. The
        # attempt that timed out is not in the history: nothing it did was ever recorded.
        assert scheduled(history) == []
        assert 5 < detected < 60
        await replayer().replay_workflow(history)
