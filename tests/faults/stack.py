"""The fault campaign's stack: PostgreSQL, Temporal, API and worker processes under one scratch folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.faults.processes import Postgres, Proc, free_port, wait_port

BIN = Path(sys.executable).parent


@dataclass
class Hook:
    """A webhook under its own endpoint: counts of one scenario never mix with another's."""

    webhook_id: str
    endpoint_id: str
    token: str
    secret: bytes
    credential: str


class FaultStack:
    """PostgreSQL, Temporal, API and worker processes under one scratch folder."""

    def __init__(
        self, root: Path, *, commit_delay: float = 0.1, log_level: str = "INFO", code: Path | None = None
    ) -> None:
        self.root = root
        # Another checkout to run the service processes (and its migrations) from; None: this one.
        self.code = code
        self.commit_delay = commit_delay
        self.log_level = log_level
        self.pg = Postgres(root / "pg")
        self.temporal_port = free_port()
        self.temporal: Proc | None = None
        self.apis: list[Proc] = []
        self.api_ports: dict[str, int] = {}
        self.workers: list[Proc] = []
        self.admin_token = "sba_" + secrets.token_hex(16)
        self.secret_key = secrets.token_hex(32)
        self.crashes: list[tuple[str, int | None, float]] = []

    # -- lifecycle

    def start(self, *, apis: int = 1, workers: int = 1) -> None:
        from cli.embedded import dev_server_args, file_store_args, temporal_cli
        from store.db import migrate

        self.pg.first_start()
        if self.code is None:
            migrate(self.pg.url)
        else:
            self._check_code()
            migrate(self.pg.url, self.code / "migrations")
        cmd = [
            temporal_cli(),
            "server",
            "start-dev",
            *file_store_args(self.root / "temporal.db"),
            "--port",
            str(self.temporal_port),
            "--ip",
            "127.0.0.1",
            "--headless",
            "--log-level",
            "error",
            *dev_server_args(),  # search attributes and the dynamic config every Switchboard server runs with
        ]
        self.temporal = Proc("temporal", cmd, {"PATH": os.environ.get("PATH", "")}, self.root / "temporal.log")
        self.start_temporal()
        for _ in range(workers):
            self.add_worker()
        for _ in range(apis):
            self.add_api()

    def start_temporal(self) -> None:
        assert self.temporal is not None
        self.temporal.start()
        wait_port(self.temporal_port, 60)

    def _check_code(self) -> None:
        # A campaign that silently ran this checkout's code against the other's schema would measure nothing.
        assert self.code is not None
        found = subprocess.run(
            [sys.executable, "-c", "import switchboard, api, worker; print(switchboard.__file__, worker.__file__)"],
            env=self._env("code-check"),
            cwd=self.code,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if not all(Path(f).resolve().is_relative_to(self.code.resolve()) for f in found):
            raise RuntimeError(f"the service processes would not import {self.code}: {found}")

    def _cli(self, command: str) -> list[str]:
        if self.code is None:
            return [str(BIN / "switchboard"), command]
        return [sys.executable, "-m", "cli.main", command]

    def _env(self, name: str) -> dict[str, str]:
        home = self.root / name
        home.mkdir(exist_ok=True)
        # PYTHONPATH (and the working directory, which `python -m` puts first on sys.path) come before this venv's
        # editable install: the processes import the other checkout.
        code = {"PYTHONPATH": str(self.code)} if self.code is not None else {}
        return {
            "PATH": os.environ.get("PATH", ""),
            **code,
            "SWITCHBOARD_HOME": str(home),
            "SWITCHBOARD_DATABASE_URL": self.pg.url,
            "SWITCHBOARD_TEMPORAL_ADDRESS": f"127.0.0.1:{self.temporal_port}",
            "SWITCHBOARD_ADMIN_TOKEN": self.admin_token,
            "SWITCHBOARD_SECRET_KEY": self.secret_key,
            "SWITCHBOARD_LOG_LEVEL": self.log_level,
            # API and worker are separate processes here, as in the production shape.
            "SWITCHBOARD_API_WORKER": "false",
            "SWITCHBOARD_FAULT_COMMIT_DELAY": str(self.commit_delay),
        }

    def add_worker(self) -> Proc:
        name = f"worker{len(self.workers)}"
        proc = Proc(name, self._cli("worker"), self._env(name), self.root / f"{name}.log", cwd=self.code)
        self.workers.append(proc)
        self.start_worker(proc)
        return proc

    def start_worker(self, proc: Proc, *, wait: bool = True) -> None:
        alive = Path(proc.env["SWITCHBOARD_HOME"]) / "worker.alive"
        alive.unlink(missing_ok=True)
        proc.start()
        if wait:
            self.wait_for(lambda: alive.exists(), 120, f"{proc.name} did not start polling", proc)

    def add_api(self) -> Proc:
        name = f"api{len(self.apis)}"
        port = free_port()
        env = self._env(name) | {"SWITCHBOARD_HTTP_PORT": str(port)}
        proc = Proc(name, self._cli("api"), env, self.root / f"{name}.log", cwd=self.code)
        self.apis.append(proc)
        self.api_ports[name] = port
        self.start_api(proc)
        return proc

    def start_api(self, proc: Proc, *, wait: bool = True) -> None:
        proc.start()
        if wait:
            url = f"{self.base(proc)}/healthz"

            def up() -> bool:
                with contextlib.suppress(httpx.HTTPError):
                    return httpx.get(url, timeout=2).status_code == 200
                return False

            self.wait_for(up, 120, f"{proc.name} did not become healthy", proc)

    def base(self, proc: Proc) -> str:
        return f"http://127.0.0.1:{self.api_ports[proc.name]}"

    def wait_for(self, ok: Callable[[], bool], timeout: float, what: str, proc: Proc | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{what}: exited\n{proc.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(0.2)

    def close(self) -> None:
        for proc in [*self.apis, *self.workers]:
            proc.thaw()
            proc.stop(timeout=20)
        if self.temporal is not None:
            self.temporal.thaw()
            self.temporal.stop(timeout=20)
        with contextlib.suppress(Exception):
            self.pg.stop()

    # -- the supervisor: a process that dies on its own is restarted, and counted

    async def supervise(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for proc in [*self.apis, *self.workers]:
                if not proc.expected_down and not proc.alive():
                    assert proc.popen is not None
                    self.crashes.append((proc.name, proc.popen.returncode, time.time()))
                    proc.start()

    @contextlib.asynccontextmanager
    async def supervised(self) -> Any:
        task = asyncio.create_task(self.supervise())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- state

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(query.encode(), params)
            return cur.fetchall() if cur.description else []

    def count(self, query: str, *params: Any) -> int:
        """The single number a `SELECT count(*) …` returns."""
        return int(self.sql(query, *params)[0][0])

    def inbox_depth(self, webhook_id: str) -> int:
        """Deliveries of the webhook still waiting in the accept-first inbox (0 without one)."""
        if not self.has_inbox():
            return 0
        return self.count("SELECT count(*) FROM delivery_inbox WHERE webhook_id = %s", webhook_id)

    def has_inbox(self) -> bool:
        """Whether the accept-first inbox (migration delivery_inbox) is in this code."""
        return bool(self.sql("SELECT to_regclass('delivery_inbox') IS NOT NULL")[0][0])

    def has_inbox_parking(self) -> bool:
        """Whether inbox rows are isolated and parked (migration inbox_parking: delivery_inbox.parked_at)."""
        found = self.sql(
            "SELECT 1 FROM information_schema.columns WHERE table_name = 'delivery_inbox' AND column_name = 'parked_at'"
        )
        return bool(found)

    def has_shared_doorbell(self) -> bool:
        """Whether rings are claimed once across processes (todos.rung_at)."""
        found = self.sql(
            "SELECT 1 FROM information_schema.columns WHERE table_name = 'todos' AND column_name = 'rung_at'"
        )
        return bool(found)

    def admin(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = httpx.post(
            f"{self.base(self.apis[0])}/admin/v1/{verb}",
            json=body,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=30,
        )
        resp.raise_for_status()
        out: dict[str, Any] = resp.json()
        return out

    def hook(self, name: str, verbs: Sequence[str] = ("create_webhook", "claim_next")) -> Hook:
        """A fresh human, agent, endpoint (with these verbs) and GitHub webhook (target queue `work`)."""
        human = self.admin("create_human", {"name": name})["human_id"]
        agent = self.admin("create_agent", {"human_id": human, "name": name})["agent_id"]
        endpoint = self.admin(
            "vend_endpoint",
            {
                "agent_id": agent,
                "queues": ["work"],
                "verbs": list(verbs),
                "webhook_max": 5,
                "webhook_source_types": ["github"],
                "webhook_queues": ["work"],
            },
        )
        resp = httpx.post(
            f"{self.base(self.apis[0])}/v1/create_webhook",
            json={"source_type": "github", "target_queue": "work"},
            headers={"Authorization": f"Bearer {endpoint['credential']}"},
            timeout=30,
        )
        resp.raise_for_status()
        webhook = resp.json()
        return Hook(
            webhook["webhook_id"],
            endpoint["endpoint_id"],
            webhook["ingest_url"].rsplit("/", 1)[-1],
            webhook["secret"].encode(),
            endpoint["credential"],
        )


@contextlib.contextmanager
def fault_stack(
    *, apis: int = 1, workers: int = 1, commit_delay: float = 0.1, keep: bool = False, code: Path | None = None
) -> Iterator[FaultStack]:
    """A started FaultStack in a scratch folder (short path: PostgreSQL's socket lives in its data dir)."""
    root = Path(tempfile.mkdtemp(prefix="sbf-"))
    stack = FaultStack(root, commit_delay=commit_delay, code=code)
    try:
        stack.start(apis=apis, workers=workers)
        yield stack
    finally:
        stack.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
