"""A hung (not stopped) PostgreSQL keeps the promised answer times (issue 29, finding 2).

With the postmaster and every backend frozen by SIGSTOP, a query is neither answered nor refused, and psycopg's
own cancellation waits for a server that cannot answer (5 s to ask, 5 s to wait). Ingest still answers 503
within 2 s, a verb 503 within the pool timeout plus its statement timeout, and /healthz within its timeout;
once the server thaws, everything answers again by itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path

import httpx
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from cli.embedded import start_postgres
from store.db import migrate
from tests.conftest import Stack, make_settings
from tests.faults.processes import frozen_postgres
from tests.helpers import eventually, issue_payload, post_github

STATEMENT_TIMEOUT = 1.0


async def timed(call: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    resp = await call
    return resp, time.monotonic() - started


async def test_a_frozen_postgres_answers_503_within_the_documented_bounds_then_recovers(
    tmp_path: Path, temporal_env: WorkflowEnvironment
) -> None:
    data_dir = tmp_path / "pg"
    # Started from this (the main) thread: the server ends with the thread that started it.
    server, url = start_postgres(data_dir, "sb_frozen")
    try:
        await asyncio.to_thread(migrate, url)
        target = temporal_env.client.service_client.config.target_host
        settings = make_settings(tmp_path, url, target, f"tq-{uuid.uuid4().hex[:8]}")
        settings.db_statement_timeout = STATEMENT_TIMEOUT
        app = create_app(settings)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as http,
        ):
            stack = Stack(settings, http, temporal_env.client, url, app)
            agent = await stack.agent()
            webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
            admin = {"Authorization": f"Bearer {settings.admin_token}"}
            verb_bound = settings.db_pool_timeout + STATEMENT_TIMEOUT

            assert server.proc is not None
            with frozen_postgres(server.proc.pid):
                resp, took = await timed(post_github(http, webhook, issue_payload(), delivery="frozen-1"))
                assert resp.status_code == 503, resp.text
                assert took < 2.0, took
                todos, took = await timed(agent.call("list_todos", {}))
                assert todos.status_code == 503 and todos.json()["error"]["code"] == "unavailable", todos.text
                assert took < verb_bound + 0.5, took
                humans, took = await timed(http.post("/admin/v1/list_humans", json={}, headers=admin))
                assert humans.status_code == 503 and humans.json()["error"]["code"] == "unavailable", humans.text
                assert took < verb_bound + 0.5, took
                health, took = await timed(http.get("/healthz"))
                assert health.status_code == 503 and took < settings.health_timeout_seconds + 0.5, (health.text, took)

            # Thawed: the pools replace the connections closed mid-statement, with nobody's help.
            async def recovered() -> bool:
                return (await agent.call("list_todos", {})).status_code == 200

            await eventually(recovered, timeout=30)
            resp = await post_github(http, webhook, issue_payload(), delivery="thawed-1")
            assert resp.status_code == 202, resp.text
            assert (await http.get("/healthz")).status_code in (200, 503)  # Temporal's half is not this test's
    finally:
        await asyncio.to_thread(server.stop)
