"""Accept first: the PostgreSQL inbox, its relays, producers' windows, admission and a webhook's pace."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from cli.embedded import search_attribute_args, start_postgres
from routing.delivery import CommitResult
from runtime.relay import InboxRelay, running_relay
from runtime.starts import start_delivery
from store.commits import CommitStore
from store.db import migrate
from store.inbox import InboxStore
from tests.conftest import Stack, make_settings, running_stack, start_temporal, worker_process_env
from tests.helpers import eventually, issue_payload, post_github, token_of
from tests.signing import sign_slack

UNREACHABLE = "127.0.0.1:1"


def count(stack: Stack, table: str) -> int:
    return int(stack.sql(f"SELECT count(*) FROM {table}")[0][0])


def inbox(stack: Stack) -> InboxStore:
    return InboxStore(stack.app.state.services.pool)


def deliveries(stack: Stack) -> CommitStore:
    return CommitStore(stack.app.state.services.pool)


async def unreachable_client() -> Client:
    return await Client.connect(UNREACHABLE, data_converter=pydantic_data_converter, lazy=True)


async def timed(call: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    resp = await call
    return resp, time.monotonic() - started


def dev_server_pid(target: str) -> int:
    """The pid of the `temporal server start-dev` process listening on target's port."""
    port = target.rsplit(":", 1)[1].encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if b"start-dev" in args and port in args:
                return int(proc.name)
    raise AssertionError(f"no dev server process for {target}")


@contextlib.asynccontextmanager
async def dedicated_temporal() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_temporal(search_attribute_args())
    try:
        yield env
    finally:
        await env.shutdown()


async def test_temporal_frozen_accepts_pending_then_routes_once_without_redelivery(
    tmp_path: Path, database_url: str, sandbox: Any
) -> None:
    async with (
        dedicated_temporal() as env,
        running_stack(tmp_path, database_url, env.client, sandbox) as stack,
        running_relay(env.client, inbox(stack), deliveries(stack), stack.settings),
    ):
        agent = await stack.agent()
        webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        pid = dev_server_pid(env.client.service_client.config.target_host)
        os.kill(pid, signal.SIGSTOP)
        try:
            resp, took = await timed(post_github(stack.http, webhook, issue_payload(), delivery="frozen-1"))
            assert resp.status_code == 202, resp.text
            body = resp.json()
            assert body["accepted"] is True and body["pending"] is True
            assert took < stack.settings.temporal_start_timeout_seconds + 1.5, took
            [(workflow_id, reason)] = stack.sql("SELECT workflow_id, reason FROM delivery_inbox")
            assert workflow_id == body["workflow_id"] and reason == "temporal_unavailable"
            # The producer's own retry while the row waits adds nothing.
            again, took = await timed(post_github(stack.http, webhook, issue_payload(), delivery="frozen-1"))
            assert again.status_code == 202 and again.json()["workflow_id"] == workflow_id
            assert took < stack.settings.temporal_start_timeout_seconds + 1.5, took
            assert count(stack, "delivery_inbox") == 1
            assert count(stack, "events") == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        # No redelivery from the producer: the relay starts it once Temporal answers again.
        await eventually(lambda: count(stack, "events") == 1 and count(stack, "delivery_inbox") == 0, timeout=60)
        result = await env.client.get_workflow_handle(workflow_id, result_type=CommitResult).result()
        assert result.disposition == "routed"
        assert count(stack, "events") == 1 and count(stack, "todos") == 1


async def test_temporal_unreachable_accepts_into_the_inbox_and_a_retry_does_not_double(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.app.state.services.temporal = await unreachable_client()
    resp, took = await timed(post_github(stack.http, webhook, issue_payload(), delivery="away-1"))
    assert resp.status_code == 202, resp.text
    assert resp.json()["pending"] is True and resp.json()["workflow_id"].startswith("delivery-")
    assert took < stack.settings.temporal_start_timeout_seconds + 1.5, took
    retry = await post_github(stack.http, webhook, issue_payload(), delivery="away-1")
    assert retry.status_code == 202 and retry.json()["workflow_id"] == resp.json()["workflow_id"]
    row = await inbox(stack).get(resp.json()["workflow_id"])
    assert row is not None and row.reason == "temporal_unavailable"
    assert row.delivery.external_id == f"{webhook['webhook_id']}:away-1" and row.delivery.verified is True
    assert count(stack, "delivery_inbox") == 1 and count(stack, "events") == 0
    stats = await inbox(stack).stats()
    assert stats.depth == 1 and stats.due == 1 and stats.oldest_age_seconds is not None
    # Temporal answers again (the suite's server): a relay routes the delivery once.
    async with running_relay(temporal_env.client, inbox(stack), deliveries(stack), stack.settings):
        await eventually(lambda: count(stack, "events") == 1 and count(stack, "delivery_inbox") == 0, timeout=60)
    assert count(stack, "todos") == 1
    assert (await inbox(stack).stats()).depth == 0


class RelayDyingAfterStarts(InboxRelay):
    """Starts its first batch, then dies before the delete: the rows stay and are started again (joined)."""

    died = False

    async def relay_once(self, limit: int) -> Any:
        if self.died:
            return await super().relay_once(limit)
        async with self.inbox.claim(limit) as claim:
            for row in claim.rows:
                await start_delivery(self.client, row.delivery, self.settings, task_queue=self.task_queue)
            self.died = bool(claim.rows)
            if claim.rows:
                raise RuntimeError("relay died between the starts and the delete")
        return await super().relay_once(limit)


async def test_two_relays_draining_one_inbox_route_each_delivery_once(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.app.state.services.temporal = await unreachable_client()
    n = 24
    answers = await asyncio.gather(
        *(post_github(stack.http, webhook, issue_payload(number=i), delivery=f"pair-{i}") for i in range(n))
    )
    assert all(a.status_code == 202 and a.json()["pending"] for a in answers)
    assert count(stack, "delivery_inbox") == n
    settings = stack.settings.model_copy(update={"relay_batch": 4, "relay_poll_seconds": 0.05})
    dying = RelayDyingAfterStarts(temporal_env.client, inbox(stack), deliveries(stack), settings)
    steady = InboxRelay(temporal_env.client, inbox(stack), deliveries(stack), settings)
    tasks = [asyncio.create_task(dying.run()), asyncio.create_task(steady.run())]
    try:
        await eventually(lambda: count(stack, "events") == n and count(stack, "delivery_inbox") == 0, timeout=60)
        # Let any second start of the rows the dying relay left behind run to its end.
        await asyncio.sleep(1.0)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert dying.died
    assert count(stack, "events") == n and count(stack, "todos") == n
    [(distinct,)] = stack.sql("SELECT count(DISTINCT external_id) FROM events")
    assert distinct == n


async def test_postgres_and_temporal_down_answers_503_fast_and_healthz_within_a_second(tmp_path: Path) -> None:
    server, url = await asyncio.to_thread(start_postgres, tmp_path / "pg", "sb_down")
    stopped = False
    try:
        await asyncio.to_thread(migrate, url)
        settings = make_settings(tmp_path, url, UNREACHABLE, f"tq-{uuid.uuid4().hex[:8]}")
        app = create_app(settings)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http,
        ):
            stack = Stack(settings, http, None, url, app)  # type: ignore[arg-type]
            agent = await stack.agent()
            webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
            await asyncio.to_thread(server.stop)  # stops PostgreSQL
            stopped = True
            for n in range(3):
                resp, took = await timed(post_github(http, webhook, issue_payload(number=n)))
                assert resp.status_code == 503, resp.text
                assert set(resp.json()) == {"error"} and isinstance(resp.json()["error"], str)
                assert took < 2.0, took
            verb, took = await timed(agent.call("list_todos", {}))
            assert verb.status_code == 503 and verb.json()["error"]["code"] == "unavailable", verb.text
            assert took < 2.0, took
            health, took = await timed(http.get("/healthz"))
            assert health.status_code == 503 and took < 1.0, (health.text, took)
            assert health.json() == {"status": "degraded", "postgres": "unavailable", "temporal": "unavailable"}
    finally:
        if not stopped:
            await asyncio.to_thread(server.stop)


async def test_slack_is_answered_inside_its_window_and_others_inside_the_default_wait(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    # No worker: the workflow never finishes, so every answer is the pending one at the end of the wait.
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 5.0
        agent = await stack.agent()
        slack = await agent.ok("create_webhook", {"source_type": "slack", "target_queue": "work"})
        body = json.dumps({"type": "event_callback", "event_id": "EvSlow", "event": {"type": "app_mention"}}).encode()
        headers = {"Content-Type": "application/json", **sign_slack(slack["secret"].encode(), body, int(time.time()))}
        resp, took = await timed(
            stack.http.post(f"/webhooks/w/{token_of(slack['ingest_url'])}", content=body, headers=headers)
        )
        assert resp.status_code == 202 and resp.json()["pending"] is True, resp.text
        assert 2.0 <= took < 3.0, took  # Slack gives up after 3 s
        github = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        resp, took = await timed(post_github(stack.http, github, issue_payload()))
        assert resp.status_code == 202 and resp.json()["pending"] is True
        assert 4.5 <= took < 6.5, took  # the default 5 s, well inside GitHub's 10 s
        # Pending in Temporal (it took the start), not in the inbox.
        assert count(stack, "delivery_inbox") == 0


async def test_past_capacity_deliveries_go_to_the_inbox_at_once(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        stack.settings.ingest_wait_seconds = 4.0
        stack.app.state.services.admission.max_inflight = 2
        agent = await stack.agent()
        webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})

        async def one(i: int) -> tuple[httpx.Response, float]:
            # Staggered so the two admitted deliveries are in flight before the rest arrive.
            await asyncio.sleep(0.3 if i >= 2 else 0)
            return await timed(post_github(stack.http, webhook, issue_payload(number=i), delivery=f"cap-{i}"))

        answers = await asyncio.gather(*(one(i) for i in range(8)))
        assert all(r.status_code == 202 and r.json()["pending"] for r, _ in answers), [r.text for r, _ in answers]
        assert all(took < 4.0 + 2.0 for _, took in answers)  # everyone inside the window
        fast = [took for _, took in answers[2:]]
        assert max(fast) < 1.5, fast  # past capacity: answered at once, not after the wait
        rows = stack.sql("SELECT reason, count(*) FROM delivery_inbox GROUP BY reason")
        assert rows == [("admission", 6)]


async def test_a_webhook_rate_defers_into_the_inbox_and_the_relay_releases_at_that_rate(
    stack: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    bad = await stack.http.post(
        "/admin/v1/set_webhook_rate",
        json={"webhook_id": webhook["webhook_id"], "rate_per_second": -1},
        headers={"Authorization": f"Bearer {stack.settings.admin_token}"},
    )
    assert bad.status_code == 422
    unknown = await stack.http.post(
        "/admin/v1/set_webhook_rate",
        json={"webhook_id": "wh_nope", "rate_per_second": 1},
        headers={"Authorization": f"Bearer {stack.settings.admin_token}"},
    )
    assert unknown.status_code == 404
    await stack.admin("set_webhook_rate", {"webhook_id": webhook["webhook_id"], "rate_per_second": 2})
    stack.settings.webhook_rate_burst = 1
    answers = await asyncio.gather(
        *(post_github(stack.http, webhook, issue_payload(number=i), delivery=f"paced-{i}") for i in range(6))
    )
    assert all(r.status_code == 202 for r in answers), [r.text for r in answers]
    # Burst 1: one delivery goes through at once, the other five wait for their slots.
    assert sorted(bool(r.json().get("pending")) for r in answers) == [False] + [True] * 5
    rows = stack.sql("SELECT reason, release_at FROM delivery_inbox ORDER BY release_at")
    assert [r[0] for r in rows] == ["rate"] * 5
    gaps = [(b[1] - a[1]).total_seconds() for a, b in itertools.pairwise(rows)]
    assert all(abs(g - 0.5) < 0.05 for g in gaps), gaps  # one slot per 1/rate seconds
    # A producer's retry of a deferred delivery takes no second row.
    again = await post_github(stack.http, webhook, issue_payload(number=3), delivery="paced-3")
    assert again.status_code == 202 and count(stack, "delivery_inbox") == 5
    started = time.monotonic()
    async with running_relay(temporal_env.client, inbox(stack), deliveries(stack), stack.settings):
        await eventually(lambda: count(stack, "events") == 6 and count(stack, "delivery_inbox") == 0, timeout=60)
    # The last slot is at least 2 s after the first deferred one: released at the rate, not at once.
    assert time.monotonic() - started >= 1.5
    assert count(stack, "todos") == 6
    # Back to the operator default (unpaced): delivered at once again.
    await stack.admin("set_webhook_rate", {"webhook_id": webhook["webhook_id"], "rate_per_second": None})
    free = await post_github(stack.http, webhook, issue_payload(number=9), delivery="free-9")
    assert free.json()["created"] == 1


async def test_a_worker_process_relays_the_inbox(stack: Stack, temporal_env: WorkflowEnvironment) -> None:
    import subprocess
    import sys

    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.app.state.services.temporal = await unreachable_client()
    for i in range(3):
        resp = await post_github(stack.http, webhook, issue_payload(number=i), delivery=f"proc-{i}")
        assert resp.status_code == 202 and resp.json()["pending"] is True
    assert count(stack, "delivery_inbox") == 3
    # The real server's address: this stack's own client was swapped for an unreachable one above.
    env = worker_process_env(
        stack,
        stack.settings.home.parent / "relay-worker",
        SWITCHBOARD_TEMPORAL_ADDRESS=temporal_env.client.service_client.config.target_host,
    )
    # `switchboard worker` as its own OS process: its relay, not this test's, drains the inbox.
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "worker"], env=env)
    try:
        await eventually(lambda: count(stack, "events") == 3 and count(stack, "delivery_inbox") == 0, timeout=90)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert count(stack, "todos") == 3
