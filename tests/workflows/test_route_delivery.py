"""RouteDelivery under failure: Temporal down, worker killed mid-delivery; and replay determinism."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from routing.delivery import CommitResult
from store.db import open_pool
from tests.conftest import Stack, running_stack, start_temporal, worker_process_env
from tests.helpers import eventually, issue_payload, post_github
from tests.workflows.replay import replay_and_keep
from worker import build_worker


async def test_temporal_unreachable_accepts_into_the_inbox(tmp_path: Path, database_url: str, sandbox: Any) -> None:
    env = await start_temporal()
    async with running_stack(tmp_path, database_url, env.client, sandbox, with_worker=False) as stack:
        agent = await stack.agent()
        webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        await env.shutdown()
        resp = await post_github(stack.http, webhook, issue_payload())
        # Accept first: the verified delivery waits in the PostgreSQL inbox for a relay (tests/api/test_inbox.py).
        assert resp.status_code == 202 and resp.json()["pending"] is True
        assert stack.sql("SELECT workflow_id FROM delivery_inbox") == [(resp.json()["workflow_id"],)]
        assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
        health = await stack.http.get("/healthz")
        assert health.status_code == 503 and health.json()["temporal"] == "unavailable"


async def test_worker_killed_mid_delivery_still_ends_with_exactly_one_todo(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    client = temporal_env.client
    async with running_stack(tmp_path, database_url, client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 1.0
        agent = await stack.agent()
        webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        env = worker_process_env(stack, tmp_path / "worker-home", SWITCHBOARD_FAULT_COMMIT_DELAY="60")
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "worker"], env=env, start_new_session=True)
        try:
            resp = await post_github(stack.http, webhook, issue_payload(), delivery="crash-1")
            assert resp.status_code == 202 and resp.json()["pending"] is True
            workflow_id = resp.json()["workflow_id"]
            handle = client.get_workflow_handle(workflow_id)

            async def task_started() -> bool:
                history = await handle.fetch_history()
                return any(e.HasField("workflow_task_started_event_attributes") for e in history.events)

            await eventually(task_started)  # the worker now runs the workflow task and its (delayed) commit
            await eventually(lambda: (tmp_path / "worker-home" / "worker.alive").exists())  # the health signal
            assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pool = await open_pool(database_url, max_size=4)
        try:
            async with build_worker(
                client, pool, stack.settings, task_queue=stack.settings.task_queue, sandbox=sandbox
            ):
                result = await client.get_workflow_handle(workflow_id, result_type=CommitResult).result()
                assert result.created == 1
                again = await post_github(stack.http, webhook, issue_payload(), delivery="crash-1")
                assert again.json()["duplicate"] is True
        finally:
            await pool.close()
        assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
        assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1


async def test_search_attributes_and_replay(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="replay-1")
    assert resp.status_code == 202
    from routing.delivery import workflow_id_for

    handle = stack.temporal.get_workflow_handle(
        workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:replay-1")
    )
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    assert attrs["SwitchboardWebhookId"] == webhook["webhook_id"]
    assert attrs["SwitchboardSource"] == "github"
    assert attrs["SwitchboardKind"] == "issues"
    assert attrs["SwitchboardDeliveryId"] == "replay-1"
    assert attrs["SwitchboardDecision"] == "routed"
    # None at start (runtime/starts.py says why): the sender's attributes come with the decision, in one upsert.
    history = await handle.fetch_history()
    assert not history.events[0].workflow_execution_started_event_attributes.search_attributes.indexed_fields
    upserts = [
        set(e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields)
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    assert len(upserts) == 1
    sender = {"SwitchboardWebhookId", "SwitchboardSource", "SwitchboardKind", "SwitchboardDeliveryId"}
    assert sender | {"SwitchboardDecision", "SwitchboardEventId"} <= upserts[0]
    await replay_and_keep(handle, "route_delivery_default.json")
