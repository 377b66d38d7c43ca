"""The fault campaign: a stack of real OS processes, fake GitHub senders, faults, and counts read from the database.

One place for the campaign, used by `bench/faults.py` (full counts) and `tests/test_faults.py` (small counts):

* `FaultStack` runs embedded PostgreSQL (pg_ctl on one data directory and socket), the Temporal dev server
  (`temporal server start-dev` on one SQLite file and port), and any number of `switchboard api` and
  `switchboard worker` processes, each its own process group, killable (SIGKILL), freezable (SIGSTOP/SIGCONT)
  and restartable by pid. A supervisor restarts a process that dies on its own (as a container restart policy
  would) and counts it as a crash.
* Senders are fake GitHub producers: signed with the webhook secret, a fresh `X-GitHub-Delivery` id per
  delivery, over real HTTP to localhost only, bounded in request count and time, never retrying (GitHub
  does not redeliver a failed delivery).
* `tally` waits for recovery, then counts exactly from the database: lost (a 202 whose delivery id has no
  event), doubled (more than one event or todo per delivery id), "created" answers per id, recovery time
  (fault end → every delivery accepted before it has its event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from api.connections import FD_RESERVE
from api.verbs import REGISTRY
from routing.text import MAX_JSON_DEPTH
from switchboard.settings import Settings
from tests.github_fake import FakeGitHub, fake_github
from tests.signing import sign_github

BIN = Path(sys.executable).parent
LATE_SECONDS = 10.0  # GitHub gives up on a delivery after 10 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


# --------------------------------------------------------------------------------------------- processes


class Proc:
    """One OS process (its own process group), started, signalled and restarted by pid."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.env = env
        self.log = log
        self.cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.expected_down = True  # the supervisor restarts the process only while this is False
        self.starts = 0
        self.nofile: int | None = None  # its descriptor limit (soft and hard) from its next start; None: inherited

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.cmd,
                env=self.env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: a kill reaches its children (sandbox) too
                preexec_fn=self._limit if self.nofile is not None else None,
            )
        self.starts += 1
        self.expected_down = False

    def _limit(self) -> None:
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def signal(self, sig: int) -> None:
        """Send sig to the process group this Proc started (its pid is the group id)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        self.expected_down = True
        self.signal(signal.SIGKILL)
        assert self.popen is not None
        self.popen.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (graceful), then SIGKILL after timeout."""
        self.expected_down = True
        if not self.alive():
            return
        self.signal(signal.SIGTERM)
        assert self.popen is not None
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)


class Postgres:
    """Embedded PostgreSQL (a child of this process, cli.embedded), stopped and started again on one data dir."""

    def __init__(self, data: Path) -> None:
        from cli.embedded import EmbeddedPostgres

        self.server = EmbeddedPostgres(data)
        self.url = ""

    def first_start(self, database: str = "switchboard") -> str:
        from store.db import ensure_database

        self.server.start()
        ensure_database(self.server.get_uri(), database)
        self.url = self.server.get_uri(database)
        return self.url

    def stop(self) -> None:
        """A fast shutdown: every connection is cut, nothing accepts until start()."""
        self.server.stop()

    def start(self) -> None:
        """Start again on the same data dir and socket; returns once it accepts connections."""
        self.server.start()

    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid


# --------------------------------------------------------------------------------------------- the stack


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


# --------------------------------------------------------------------------------------------- producers


@dataclass
class Answer:
    """What one producer's POST heard back."""

    delivery: str
    api: int
    started: float  # wall clock (time.time())
    took: float
    status: int | None  # None: no HTTP answer (refused, reset, timed out)
    error: str | None = None
    created: int | None = None
    pending: bool = False
    duplicate: bool = False


def issue_body(n: int, delivery: str) -> bytes:
    return json.dumps(
        {
            "action": "opened",
            "issue": {"number": n, "title": f"issue {n} ({delivery[:8]})", "body": "x" * 500},
            "repository": {"full_name": "acme/app"},
            "sender": {"login": "joe"},
        }
    ).encode()


async def post_delivery(http: httpx.AsyncClient, base: str, api: int, hook: Hook, delivery: str, body: bytes) -> Answer:
    """One signed GitHub `issues` delivery; never retried."""
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
    headers.update(sign_github(hook.secret, body))
    started, t0 = time.time(), time.perf_counter()
    try:
        resp = await http.post(f"{base}/webhooks/w/{hook.token}", content=body, headers=headers)
    except httpx.HTTPError as exc:
        return Answer(delivery, api, started, time.perf_counter() - t0, None, error=type(exc).__name__)
    took = time.perf_counter() - t0
    answer = Answer(delivery, api, started, took, resp.status_code)
    if resp.status_code == 202:
        with contextlib.suppress(ValueError):
            data = resp.json()
            answer.created = data.get("created")
            answer.pending = bool(data.get("pending"))
            answer.duplicate = bool(data.get("duplicate"))
    return answer


class Load:
    """`senders` producers posting fresh deliveries until stopped or out of budget, spread over the APIs.

    With several APIs the senders act as a load balancer would (nginx's default `proxy_next_upstream error`):
    a connection refused, where nothing was sent, is tried once on the next API; any other failure (reset,
    timeout, an answer) stands, because the delivery may have been taken.
    """

    def __init__(
        self,
        stack: FaultStack,
        hook: Hook,
        *,
        senders: int = 4,
        interval: float = 0.25,
        max_requests: int = 2000,
        max_seconds: float = 600.0,
    ) -> None:
        self.stack = stack
        self.hook = hook
        self.senders = senders
        self.interval = interval
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.answers: list[Answer] = []
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._sent = 0
        self.failovers = 0

    async def _sender(self, k: int) -> None:
        deadline = time.monotonic() + self.max_seconds
        async with httpx.AsyncClient(timeout=30) as http:
            i = k
            while not self._stop.is_set() and self._sent < self.max_requests and time.monotonic() < deadline:
                self._sent += 1
                api = i % len(self.stack.apis)
                delivery = str(uuid.uuid4())
                body = issue_body(i, delivery)
                base = self.stack.base(self.stack.apis[api])
                answer = await post_delivery(http, base, api, self.hook, delivery, body)
                if answer.error == "ConnectError" and len(self.stack.apis) > 1:
                    self.failovers += 1
                    api = (api + 1) % len(self.stack.apis)
                    base = self.stack.base(self.stack.apis[api])
                    answer = await post_delivery(http, base, api, self.hook, delivery, body)
                self.answers.append(answer)
                async with self._progress:
                    self._progress.notify_all()
                i += self.senders
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._sender(k)) for k in range(self.senders)]

    async def stop(self) -> list[Answer]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.answers

    async def until(self, count: int, within: float = 120) -> None:
        """Wait until `count` more answers arrived (so a fault lands under load)."""
        target = len(self.answers) + count
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self._progress:
                await self._progress.wait_for(lambda: len(self.answers) >= target)


async def storm(stack: FaultStack, hook: Hook, ids: int, posts: int, concurrency: int) -> list[Answer]:
    """`ids` deliveries each posted `posts` times (same id, same body), `concurrency` posts in flight."""
    work = [(n, f"storm-{n}-{uuid.uuid4().hex[:8]}") for n in range(ids)]
    queue = [item for item in work for _ in range(posts)]
    random.shuffle(queue)
    bodies = {d: issue_body(n, d) for n, d in work}
    answers: list[Answer] = []

    async def runner() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while queue:
                _, delivery = queue.pop()
                api = len(answers) % len(stack.apis)
                base = stack.base(stack.apis[api])
                answers.append(await post_delivery(http, base, api, hook, delivery, bodies[delivery]))

    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return answers


# --------------------------------------------------------------------------------------------- doorbell


class Rings:
    """One SSE client on `GET /v1/stream` of one API, reconnecting after that API dies; collects todo ids."""

    def __init__(self, base: str, credential: str) -> None:
        self.base = base
        self.credential = credential
        self.todo_ids: list[str] = []
        self.subscribed = asyncio.Event()
        self.connects = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.credential}", "Accept": "text/event-stream"}
        timeout = httpx.Timeout(10.0, read=None)
        while True:
            try:
                async with (
                    httpx.AsyncClient(timeout=timeout) as http,
                    http.stream("GET", f"{self.base}/v1/stream", headers=headers) as resp,
                ):
                    if resp.status_code != 200:
                        await asyncio.sleep(0.5)
                        continue
                    self.connects += 1
                    event, ident = "", ""
                    async for line in resp.aiter_lines():
                        if line.startswith(":") and "subscribed" in line:
                            self.subscribed.set()
                        elif line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("id:"):
                            ident = line[3:].strip()
                        elif line == "":
                            if event == "todo" and ident:
                                self.todo_ids.append(ident)
                            event, ident = "", ""
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# --------------------------------------------------------------------------------------------- counting


@dataclass
class Outcome:
    """One scenario's counts, exact from the database after recovery."""

    name: str
    sent: int = 0
    accepted: int = 0  # 202
    unavailable: int = 0  # 503
    other: Counter[str] = field(default_factory=Counter)  # other statuses, and "no answer" by error type
    pending: int = 0
    late: int = 0  # answered after GitHub's 10 s
    lost: int = 0
    doubled: int = 0
    created_answers: dict[str, int] = field(default_factory=dict)  # per delivery id
    pending_ids: set[str] = field(default_factory=set)  # ids with at least one `202 pending` answer
    first_said_duplicate: int = 0  # a delivery sent once, answered duplicate (misreported)
    stored_unacked: int = 0  # an event exists though the producer was told it failed
    recovery: float | None = None  # seconds, fault end → every delivery accepted before it has its event
    unavailable_outside_fault: int = 0  # 503s to requests that began after the fault ended (or ended before it)
    last_unavailable_after: float | None = None  # seconds after the fault ended that the last such request began
    inbox_left: int | None = None
    crashes: int = 0
    events: int = 0
    todos: int = 0
    rings: int | None = None  # scale-out: rings received by the SSE clients, all APIs together
    ring_dups: int | None = None  # a todo rung more than once
    unrung: int | None = None  # a todo no client was rung for
    bound: str = ""  # what the scenario holds its clients or its inputs to, as measured (the client-bound rows)
    bound_held: bool | None = None  # None: the row has no such bound
    notes: list[str] = field(default_factory=list)

    @property
    def stranded(self) -> int:
        """Deliveries answered 202 still waiting in the accept-first inbox after recovery."""
        return self.inbox_left or 0

    def row(self) -> str:
        rec = "-" if self.recovery is None else f"{self.recovery:.1f}"
        other = sum(self.other.values())
        held = "" if self.bound_held is None else f"  {'held' if self.bound_held else 'BROKEN'}: {self.bound}"
        return (
            f"{self.name:<26} {self.sent:>5} {self.accepted:>5} {self.unavailable:>5} {other:>6} {self.lost:>5} "
            f"{self.doubled:>7} {rec:>9}   {self.pending:>7} {self.late:>5} {self.first_said_duplicate:>8} "
            f"{self.stored_unacked:>8} {self.crashes:>7} {self.stranded:>8}{held}"
        )

    @staticmethod
    def header() -> str:
        return (
            f"{'fault':<26} {'sent':>5} {'202':>5} {'503':>5} {'other':>6} {'lost':>5} {'doubled':>7} "
            f"{'recover s':>9}   {'pending':>7} {'>10s':>5} {'dup-1st':>8} {'unacked+':>8} {'crashes':>7} "
            f"{'stranded':>8}  bound"
        )

    def details(self) -> str:
        parts = (
            [f"bound {'held' if self.bound_held else 'BROKEN'}: {self.bound}"] if self.bound_held is not None else []
        )
        if self.other:
            parts.append("other: " + ", ".join(f"{k} ×{v}" for k, v in sorted(self.other.items())))
        created = Counter(self.created_answers.values())
        if created:
            parts.append("created answers per id: " + ", ".join(f"{k}→{v} ids" for k, v in sorted(created.items())))
        parts.append(f"events {self.events}, todos {self.todos}")
        if self.inbox_left is not None:
            parts.append(f"inbox left {self.inbox_left}")
        if self.unavailable_outside_fault:
            parts.append(
                f"503 outside the fault window: {self.unavailable_outside_fault}"
                f" (the last to a request begun {self.last_unavailable_after or 0:.1f} s after the fault ended)"
            )
        if self.rings is not None:
            parts.append(f"rings {self.rings} (rung twice: {self.ring_dups})")
        parts.extend(self.notes)
        return "; ".join(parts)


def _events_by_delivery(stack: FaultStack, hook: Hook) -> dict[str, tuple[int, float, int]]:
    """delivery id → (events, first created_at epoch, todos) for the hook, straight from the tables."""
    rows = stack.sql(
        "SELECT e.external_id, count(DISTINCT e.id), min(extract(epoch FROM e.created_at))::float8, count(t.id)"
        " FROM events e LEFT JOIN todos t ON t.event_id = e.id"
        " WHERE e.webhook_id = %s GROUP BY e.external_id",
        hook.webhook_id,
    )
    prefix = f"{hook.webhook_id}:"
    return {str(r[0]).removeprefix(prefix): (int(r[1]), float(r[2]), int(r[3])) for r in rows}


async def tally(
    stack: FaultStack,
    hook: Hook,
    name: str,
    answers: list[Answer],
    *,
    faults: list[tuple[float, float]] | None = None,
    within: float = 240.0,
) -> Outcome:
    """Wait until every accepted delivery has its event (or timeout) and the inbox drained, then count."""
    faults = faults or []
    out = Outcome(name)
    accepted = {a.delivery for a in answers if a.status == 202}
    inbox = await asyncio.to_thread(stack.has_inbox)
    deadline = time.monotonic() + within
    seen: dict[str, tuple[int, float, int]] = {}
    while True:
        try:
            seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
            depth = await asyncio.to_thread(stack.inbox_depth, hook.webhook_id)
        except psycopg.Error:  # PostgreSQL not back yet
            seen, depth = {}, 1
        if (accepted <= seen.keys() and depth == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    # Settle: anything still on its way (a relayed start, a retried commit) lands before we count doubles.
    await asyncio.sleep(2.0)
    seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
    if inbox:
        out.inbox_left = await asyncio.to_thread(stack.inbox_depth, hook.webhook_id)
    orphans = await asyncio.to_thread(
        stack.count,
        "SELECT count(*) FROM todos t WHERE t.endpoint_id = %s AND NOT EXISTS"
        " (SELECT 1 FROM events e WHERE e.id = t.event_id)",
        hook.endpoint_id,
    )
    out.todos = await asyncio.to_thread(
        stack.count, "SELECT count(*) FROM todos WHERE endpoint_id = %s", hook.endpoint_id
    )
    out.events = sum(v[0] for v in seen.values())

    times_sent = Counter(a.delivery for a in answers)
    out.sent = len(answers)
    for a in answers:
        if a.status == 202:
            out.accepted += 1
            out.pending += a.pending
            if a.pending:
                out.pending_ids.add(a.delivery)
            if a.created:
                out.created_answers[a.delivery] = out.created_answers.get(a.delivery, 0) + 1
            else:
                out.created_answers.setdefault(a.delivery, 0)
            if a.duplicate and times_sent[a.delivery] == 1:
                out.first_said_duplicate += 1
        elif a.status == 503:
            out.unavailable += 1
            end = a.started + a.took
            if not any(a.started <= stop and end >= start for start, stop in faults):
                out.unavailable_outside_fault += 1
                after = a.started - max((stop for _, stop in faults), default=a.started)
                out.last_unavailable_after = max(out.last_unavailable_after or 0.0, after)
        elif a.status is None:
            out.other[f"no answer ({a.error})"] += 1
        else:
            out.other[str(a.status)] += 1
        if a.took > LATE_SECONDS:
            out.late += 1
    out.lost = len(accepted - seen.keys())
    out.doubled = sum(1 for n, _, todos in seen.values() if n > 1 or todos > 1) + orphans
    told_failed = {a.delivery for a in answers if a.status != 202} - accepted
    out.stored_unacked = len(told_failed & seen.keys())
    if faults:
        fault_end = max(stop for _, stop in faults)
        before = [seen[d][1] for d in accepted if d in seen and _first(answers, d) <= fault_end]
        out.recovery = max(0.0, max(before, default=fault_end) - fault_end)
    out.crashes = len(stack.crashes)
    if out.lost:
        missing = sorted(accepted - seen.keys())[:5]
        out.notes.append(f"lost ids (first 5): {', '.join(missing)}")
    return out


def _first(answers: list[Answer], delivery: str) -> float:
    return min(a.started for a in answers if a.delivery == delivery)


# --------------------------------------------------------------------------------------------- scenarios


@dataclass
class Counts:
    """How hard each scenario pushes: bench/faults.py uses FULL, the suite SMALL."""

    worker_kills: int = 20
    outage: float = 20.0
    api_restarts: int = 3
    storm_ids: int = 10
    storm_posts: int = 50
    storm_concurrency: int = 50
    lead: float = 3.0  # seconds of load before a fault
    tail: float = 5.0  # seconds of load after a fault ends
    senders: int = 4
    interval: float = 0.25
    api_down: float = 30.0  # the reconcile row: the API down this long while GitHub sends
    slow_one_address: int = 1000  # slow connections from one client address
    slow_spread: int = 4000  # more slow connections, spread over `slow_addresses` other addresses
    slow_addresses: int = 40
    slow_nofile: int | None = 3000  # the API's descriptor limit during the slow-clients row (None: unchanged)
    hangups: int = 100  # producers hanging up mid-body
    hostile_rounds: int = 5  # each hostile body delivered this many times (fresh delivery ids)


FULL = Counts()
SMALL = Counts(
    worker_kills=3,
    outage=5.0,
    api_restarts=1,
    storm_ids=3,
    storm_posts=10,
    storm_concurrency=10,
    lead=2.0,
    tail=3.0,
    api_down=5.0,
    slow_one_address=300,
    slow_spread=0,
    slow_nofile=None,
    hangups=10,
    hostile_rounds=1,
)


Fault = Callable[[Load], Awaitable[list[tuple[float, float]]]]
"""Applies a fault while the load runs; returns the fault windows (wall-clock start, end)."""


async def under_load(stack: FaultStack, hook: Hook, counts: Counts, name: str, fault: Fault) -> Outcome:
    """Load for `lead` s, the fault, load for `tail` s more; then recovery and the exact counts."""
    crashes = len(stack.crashes)
    load = Load(stack, hook, senders=counts.senders, interval=counts.interval)
    load.start()
    try:
        await asyncio.sleep(counts.lead)
        windows = await fault(load)
        await asyncio.sleep(counts.tail)
    finally:
        answers = await load.stop()
    out = await tally(stack, hook, name, answers, faults=windows)
    out.crashes = len(stack.crashes) - crashes
    if load.failovers:
        out.notes.append(
            f"connection refused, sent to the other API instead (as a load balancer does): {load.failovers}"
        )
    return out


async def worker_kills(stack: FaultStack, counts: Counts) -> Outcome:
    """SIGKILL the worker mid-delivery `worker_kills` times under load; each time it is started again."""
    hook = await asyncio.to_thread(stack.hook, "worker-kill")
    worker = stack.workers[0]

    async def fault(load: Load) -> list[tuple[float, float]]:
        windows = []
        for _ in range(counts.worker_kills):
            await load.until(counts.senders)  # deliveries are in flight
            await asyncio.sleep(random.uniform(0.1, 0.6))
            killed = time.time()
            await asyncio.to_thread(worker.kill)
            await asyncio.to_thread(stack.start_worker, worker)
            windows.append((killed, time.time()))
        return windows

    return await under_load(stack, hook, counts, f"worker SIGKILL ×{counts.worker_kills}", fault)


async def temporal_outage(stack: FaultStack, counts: Counts) -> Outcome:
    """Stop the Temporal dev server for `outage` seconds under load, then start it on the same file and port."""
    hook = await asyncio.to_thread(stack.hook, "temporal-outage")
    assert stack.temporal is not None
    temporal = stack.temporal

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        await asyncio.to_thread(temporal.stop)
        await asyncio.sleep(counts.outage)
        await asyncio.to_thread(stack.start_temporal)
        return [(began, time.time())]  # the fault ends when the server listens again

    return await under_load(stack, hook, counts, f"Temporal stopped {counts.outage:.0f} s", fault)


async def temporal_freeze(stack: FaultStack, counts: Counts) -> Outcome:
    """Freeze the Temporal dev server (SIGSTOP) for `outage` seconds under load: connections hang, not refuse."""
    hook = await asyncio.to_thread(stack.hook, "temporal-freeze")
    assert stack.temporal is not None
    temporal = stack.temporal

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        temporal.freeze()
        await asyncio.sleep(counts.outage)
        temporal.thaw()
        return [(began, time.time())]

    return await under_load(stack, hook, counts, f"Temporal frozen {counts.outage:.0f} s", fault)


async def postgres_outage(stack: FaultStack, counts: Counts) -> Outcome:
    """Stop PostgreSQL (fast shutdown) for `outage` seconds under load, then start it on the same data dir."""
    hook = await asyncio.to_thread(stack.hook, "postgres-outage")

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        await asyncio.to_thread(stack.pg.stop)
        await asyncio.sleep(counts.outage)
        await asyncio.to_thread(stack.pg.start)  # returns once it accepts connections
        return [(began, time.time())]

    return await under_load(stack, hook, counts, f"PostgreSQL stopped {counts.outage:.0f} s", fault)


async def api_restarts(stack: FaultStack, counts: Counts) -> Outcome:
    """Restart the (one) API process under load: SIGTERM (uvicorn drains what is in flight), then start again."""
    hook = await asyncio.to_thread(stack.hook, "api-restart")
    api = stack.apis[0]

    async def fault(load: Load) -> list[tuple[float, float]]:
        windows = []
        for _ in range(counts.api_restarts):
            await load.until(counts.senders)
            began = time.time()
            await asyncio.to_thread(api.stop)
            await asyncio.to_thread(stack.start_api, api)
            windows.append((began, time.time()))
        return windows

    return await under_load(stack, hook, counts, f"API restarted ×{counts.api_restarts}", fault)


async def duplicate_storm(stack: FaultStack, counts: Counts) -> Outcome:
    """`storm_ids` delivery ids, each posted `storm_posts` times concurrently."""
    hook = await asyncio.to_thread(stack.hook, "storm")
    answers = await storm(stack, hook, counts.storm_ids, counts.storm_posts, counts.storm_concurrency)
    return await tally(stack, hook, f"duplicate storm {counts.storm_ids}×{counts.storm_posts}", answers, faults=None)


async def scale_out(stack: FaultStack, counts: Counts) -> Outcome:
    """Two APIs and two workers (separate processes) on one PostgreSQL and one Temporal; an SSE client on each
    API for the same endpoint; load over both APIs; SIGKILL one worker and one API mid-load, both restarted."""
    while len(stack.apis) < 2:
        await asyncio.to_thread(stack.add_api)
    while len(stack.workers) < 2:
        await asyncio.to_thread(stack.add_worker)
    hook = await asyncio.to_thread(stack.hook, "scale-out")
    rings = [Rings(stack.base(api), hook.credential) for api in stack.apis[:2]]
    for r in rings:
        r.start()
    await asyncio.wait_for(asyncio.gather(*(r.subscribed.wait() for r in rings)), 60)
    worker, api = stack.workers[1], stack.apis[1]

    async def fault(load: Load) -> list[tuple[float, float]]:
        await load.until(counts.senders * 2)
        began = time.time()
        await asyncio.to_thread(worker.kill)
        await load.until(counts.senders)
        await asyncio.to_thread(api.kill)
        api_killed = time.time()
        await asyncio.to_thread(stack.start_worker, worker)
        await asyncio.to_thread(stack.start_api, api)
        return [(began, api_killed), (api_killed, time.time())]

    out = await under_load(stack, hook, counts, "scale-out 2 API + 2 workers", fault)
    # Rings travel after the commit: give the last ones a moment, then compare with the todos.
    deadline = time.monotonic() + 10
    while sum(len(r.todo_ids) for r in rings) < out.todos and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    for r in rings:
        await r.stop()
    every = [t for r in rings for t in r.todo_ids]
    out.rings = len(every)
    out.ring_dups = len(every) - len(set(every))
    todo_ids = {
        str(r[0])
        for r in await asyncio.to_thread(stack.sql, "SELECT id FROM todos WHERE endpoint_id = %s", hook.endpoint_id)
    }
    unrung = todo_ids - set(every)
    out.notes.append(f"todos never rung on a client: {len(unrung)}; per API rings {[len(r.todo_ids) for r in rings]}")
    shared = await asyncio.to_thread(stack.has_shared_doorbell)
    if unrung and shared:
        # Which were claimed by a process (rung_at set) but never reached its client: the killed API's in-flight.
        claimed = await asyncio.to_thread(
            stack.count, "SELECT count(*) FROM todos WHERE id = ANY(%s) AND rung_at IS NOT NULL", list(unrung)
        )
        out.notes.append(f"of those, claimed (rung_at set) but not received: {claimed}")
    out.unrung = len(unrung)
    return out


# --------------------------------------------------------------------------------------------- client bounds
# Issue 29, findings 3 to 7: clients and their inputs, bounded. Each row runs under the usual load and adds its
# bound, measured from outside (the answers, /metrics, the API's own log) and checked (`bound_held`).

BOUND = Settings.model_fields
HEALTH_ADDRESS = "127.0.0.3"  # the orchestrator's health checks come from here, never from a flooding address


def _metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of a metric's samples in a Prometheus text page whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total


async def _scrape(base: str) -> str:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=HEALTH_ADDRESS)) as http:
        return (await http.get(f"{base}/metrics", timeout=10)).text


def _answer_status(data: bytes) -> str:
    """`429`, `408`, … from the start of an HTTP answer; `closed` for none."""
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "closed"


def _code(resp: httpx.Response) -> str:
    """An answer's error code, `-` for a success, `not JSON` for an answer that is not the API's error body."""
    if resp.status_code < 400:
        return "-"
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "not JSON"


def _log_from(path: Path, offset: int) -> list[str]:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace").splitlines()


class _SlowClient(asyncio.Protocol):
    """One connection that is fed its request a byte at a time (by slow_clients' ticker) and records the answer."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.started = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self.answer = b""
        self.sent = 0
        self.error: BaseException | None = None
        self.life: float | None = None  # seconds from connecting to the server closing it
        self.abandoned = False  # still open when the flood ended: closed by us, not by the server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.answer += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.error = exc
        self.life = time.monotonic() - self.started

    def verdict(self) -> str:
        if self.abandoned or self.life is None:
            return "held past its head"
        if self.answer:
            return _answer_status(self.answer)
        return "reset" if self.error is not None else "closed"


def _restart(stack: FaultStack, api: Proc, nofile: int | None) -> None:
    """Restart an API process with this descriptor limit (None: the campaign's own)."""
    api.stop()
    api.nofile = nofile
    stack.start_api(api)


async def slow_clients(stack: FaultStack, counts: Counts) -> Outcome:
    """Connections that send one byte a second and never a whole request head, under load: `slow_one_address`
    from one address, `slow_spread` more over `slow_addresses` others; with `slow_nofile`, the API restarted with
    that descriptor limit first, so the flood outnumbers its descriptors (the full run). /healthz probed from
    another address on a new connection every half second, during and after. Bound: the per-address cap (the rest
    refused at once), the global cap (the oldest waiting connections evicted), every slow connection cut at the
    head deadline, no `accept()` out of descriptors, /healthz answered 200 every time."""
    hook = await asyncio.to_thread(stack.hook, "slow-clients")
    api = stack.apis[0]
    port, base = stack.api_ports[api.name], stack.base(api)
    offset = api.log.stat().st_size
    head_s = float(BOUND["http_head_timeout_seconds"].default)
    per_address = int(BOUND["http_max_connections_per_address"].default)
    total = int(BOUND["http_max_connections"].default)
    clients: list[_SlowClient] = []
    unconnected: Counter[str] = Counter()
    health: list[tuple[int | None, float]] = []
    open_max = 0.0
    stop = asyncio.Event()
    request = b"POST /webhooks/w/0123456789abcdef0123456789abcdef HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100

    async def connect(group: str, source: str) -> None:
        loop = asyncio.get_running_loop()
        client = _SlowClient(group)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: client, "127.0.0.1", port, local_addr=(source, 0)), 10
            )
        except (OSError, TimeoutError):
            unconnected[group] += 1
            return
        clients.append(client)

    async def tick() -> None:
        # One byte a second to every connection still open: one timer for all of them.
        while not stop.is_set():
            for client in clients:
                if client.life is None and client.transport is not None and client.sent < len(request):
                    client.transport.write(request[client.sent : client.sent + 1])
                    client.sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def probe() -> None:
        nonlocal open_max
        while not stop.is_set():
            # A new connection each time, as an orchestrator's probe opens: it must get in during the flood.
            transport = httpx.AsyncHTTPTransport(local_address=HEALTH_ADDRESS)
            async with httpx.AsyncClient(transport=transport, timeout=5) as http:
                t0 = time.perf_counter()
                try:
                    status: int | None = (await http.get(f"{base}/healthz")).status_code
                    took = time.perf_counter() - t0
                    page = (await http.get(f"{base}/metrics")).text
                    open_max = max(open_max, _metric(page, "switchboard_http_connections"))
                except httpx.HTTPError:
                    status, took = None, time.perf_counter() - t0
                health.append((status, took))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        ticking, probing = asyncio.create_task(tick()), asyncio.create_task(probe())
        sources = [("one", "127.0.0.2")] * counts.slow_one_address + [
            ("spread", f"127.0.1.{1 + i % counts.slow_addresses}") for i in range(counts.slow_spread)
        ]
        for i in range(0, len(sources), 500):  # opened in bursts the listen backlog takes
            await asyncio.gather(*(connect(group, source) for group, source in sources[i : i + 500]))
        deadline = time.monotonic() + head_s + 30
        while any(c.life is None for c in clients) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        ended = time.time()
        await asyncio.sleep(3.0)  # /healthz after the flood: it must not stay broken
        stop.set()
        await asyncio.gather(ticking, probing)
        for client in clients:
            if client.life is None and client.transport is not None:
                client.abandoned = True
                client.transport.close()
        return [(began, ended)]

    name = f"slow clients ×{counts.slow_one_address + counts.slow_spread}"
    if counts.slow_nofile is not None:
        # As on a host with a small descriptor limit: the flood has more connections than the process descriptors.
        name += f", {counts.slow_nofile} fds"
        total = min(total, counts.slow_nofile - FD_RESERVE)
        await asyncio.to_thread(_restart, stack, api, counts.slow_nofile)
        offset = api.log.stat().st_size
    try:
        out = await under_load(stack, hook, counts, name, fault)
    finally:
        if counts.slow_nofile is not None:
            await asyncio.to_thread(_restart, stack, api, None)
    verdicts = Counter(c.verdict() for c in clients) + Counter({"no connection": sum(unconnected.values())})
    refused_one = sum(1 for c in clients if c.group == "one" and c.verdict() == "429")
    held_one = sum(1 for c in clients if c.group == "one") - refused_one
    healthy = sum(1 for status, _ in health if status == 200)
    slowest_health = max((took for _, took in health), default=0.0)
    longest = max((c.life for c in clients if c.life is not None), default=0.0)
    lines = _log_from(api.log, offset)
    exhausted = sum("out of system resource" in line for line in lines)
    served = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("message") == "request" and entry.get("path") == "/healthz":
                served.append(float(entry.get("ms", 0)))
    out.bound = (
        f"one address held {held_one} (cap {per_address}), refused {refused_one} at once; at most {open_max:.0f}"
        f" open in all (cap {total}); longest slow connection {longest:.1f} s (head deadline {head_s:g} s);"
        f" accept() out of descriptors ×{exhausted}; /healthz 200 ×{healthy}/{len(health)} (slowest"
        f" {slowest_health:.2f} s at the client, {max(served, default=0) / 1000:.2f} s in the API); answers"
        f" {', '.join(f'{k} ×{v}' for k, v in sorted(verdicts.items()))}"
    )
    out.bound_held = (
        held_one <= per_address
        and open_max <= total
        and longest <= head_s + 5.0
        and "held past its head" not in verdicts
        and exhausted == 0
        and healthy == len(health) > 0
    )
    return out


async def producer_hangups(stack: FaultStack, counts: Counts) -> Outcome:
    """`hangups` producers send a signed delivery's head and half its body, then hang up, under load. Bound: each
    is counted as a disconnect (ingest status 499), none as a 500, and the API logs no ERROR and nothing but JSON."""
    hook = await asyncio.to_thread(stack.hook, "hang-ups")
    api = stack.apis[0]
    port, base = stack.api_ports[api.name], stack.base(api)
    log = api.log
    offset = log.stat().st_size
    before = await _scrape(base)

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        for n in range(counts.hangups):
            delivery = str(uuid.uuid4())
            body = issue_body(n, delivery)
            headers = {
                "Host": "x",
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": delivery,
                **sign_github(hook.secret, body),
            }
            head = f"POST /webhooks/w/{hook.token} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.4", 0))
            writer.write(head.encode() + b"\r\n" + body[: len(body) // 2])
            await writer.drain()
            writer.close()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, f"producers hang up ×{counts.hangups}", fault)
    after = await _scrape(base)

    def delta(status: str) -> int:
        name, labels = "switchboard_ingest_requests_total", {"status": status}
        return round(_metric(after, name, labels) - _metric(before, name, labels))

    lines = _log_from(log, offset)
    errors = non_json = 0
    for line in lines:
        try:
            errors += json.loads(line).get("level") in ("ERROR", "CRITICAL")
        except ValueError:
            non_json += 1
    disconnects, failures = delta("499"), delta("500")
    out.bound = (
        f"{counts.hangups} hang-ups: {disconnects} × 499, {failures} × 500; API log: {errors} ERROR lines,"
        f" {non_json} of {len(lines)} lines not JSON"
    )
    out.bound_held = disconnects == counts.hangups and failures == 0 and errors == 0 and non_json == 0
    return out


def _hostile_bodies() -> dict[str, bytes]:
    """Bodies a producer may sign: nested past every parser's limit, past pydantic's, just past ours; a lone
    surrogate escape."""
    deep = MAX_JSON_DEPTH + 1

    def nested(depth: int) -> bytes:
        return b'{"action": "opened", "x": ' + b"[" * depth + b"1" + b"]" * depth + b"}"

    return {
        "nested-5000": nested(5000),
        "nested-300": nested(300),
        f"nested-{deep}": nested(deep - 1),
        "lone-surrogate": b'{"action": "opened", "issue": {"number": 1, "title": "\\ud800"}}',
    }


async def hostile_bodies(stack: FaultStack, counts: Counts) -> Outcome:
    """Signed deliveries with hostile bodies among the load, each then read back. Bound: every one accepted and
    routed, and every stored event and todo answers its read (200)."""
    verbs = ["create_webhook", "claim_next", "get_webhook_event", "get_todo", "list_webhook_events"]
    hook = await asyncio.to_thread(stack.hook, "hostile-bodies", verbs)
    base = stack.base(stack.apis[0])
    sent: list[str] = []

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(counts.hostile_rounds):
                for name, body in _hostile_bodies().items():
                    delivery = f"{name}-{uuid.uuid4().hex[:12]}"
                    load.answers.append(await post_delivery(http, base, 0, hook, delivery, body))
                    sent.append(delivery)
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, f"hostile bodies ×{counts.hostile_rounds * 4}", fault)
    rows = await asyncio.to_thread(
        stack.sql,
        "SELECT e.id, t.id FROM events e LEFT JOIN todos t ON t.event_id = e.id WHERE e.external_id = ANY(%s)",
        [f"{hook.webhook_id}:{d}" for d in sent],
    )
    statuses: Counter[str] = Counter()
    auth = {"Authorization": f"Bearer {hook.credential}"}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
        for event_id, todo_id in rows:
            for what, verb, body in (
                ("event", "get_webhook_event", {"event_id": event_id}),
                ("todo", "get_todo", {"todo_id": todo_id}),
            ):
                try:
                    statuses[f"{what} {(await http.post(f'/v1/{verb}', json=body)).status_code}"] += 1
                except httpx.HTTPError as exc:
                    statuses[f"{what} no answer ({type(exc).__name__})"] += 1
    out.bound = (
        f"{len(sent)} hostile bodies (nested 5000, 300 and {MAX_JSON_DEPTH + 1} deep, a lone surrogate):"
        f" {len(rows)} stored; reads {', '.join(f'{k} ×{v}' for k, v in sorted(statuses.items()))}"
    )
    out.bound_held = len(rows) == len(sent) and statuses == Counter({"event 200": len(sent), "todo 200": len(sent)})
    return out


async def hostile_calls(stack: FaultStack, counts: Counts) -> Outcome:
    """An endpoint's own hostile verb calls among the load on its webhook: arguments nested 300 and 5000 deep (the
    writes that used to be applied and then made every read fail, rule params among them, which held every
    delivery in load_grant), bodies that are not UTF-8, integers of 5,000 digits, a string for a boolean, a GET on
    a verb. Bound: each answered as the README says, never 5xx, every read after it 200, deliveries still routed."""
    hook = await asyncio.to_thread(stack.hook, "hostile-calls", list(REGISTRY))
    base = stack.base(stack.apis[0])
    answers: list[tuple[str, bool]] = []
    sweep: Counter[str] = Counter()
    deep = json.loads("[" * 300 + "1" + "]" * 300)
    very_deep = b'{"x": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}"

    async def expect(
        what: str, call: Awaitable[httpx.Response], status: int, code: str | None = None
    ) -> httpx.Response | None:
        try:
            resp = await call
        except httpx.HTTPError:
            answers.append((what, False))
            return None
        answers.append((what, resp.status_code == status and (code is None or _code(resp) == code)))
        return resp

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        auth = {"Authorization": f"Bearer {hook.credential}"}
        w = hook.webhook_id
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            rules = {"webhook_id": w, "rules": [], "params": {"deep": deep}}
            await expect("deep rule params", http.post("/v1/set_webhook_rules", json=rules), 422, "too_deep")
            await expect("rules read", http.post("/v1/list_webhook_rules", json={"webhook_id": w}), 200)
            await load.until(counts.senders)
            claimed = await expect("claim", http.post("/v1/claim_next", json={}), 200)
            todo = claimed.json().get("todo") if claimed is not None else None
            if todo:
                done = {"todo_id": todo["id"], "result": deep}
                await expect("deep result", http.post("/v1/complete", json=done), 422, "too_deep")
                await expect("todo read", http.post("/v1/get_todo", json={"todo_id": todo["id"]}), 200)
            schedule = {"cron": "@daily", "webhook_id": w, "title": "t", "payload": {"deep": deep}}
            await expect("deep schedule", http.post("/v1/create_schedule", json=schedule), 422, "too_deep")
            listed = await expect("schedules read", http.post("/v1/list_schedules", json={}), 200)
            answers.append(("no schedule made", listed is not None and listed.json().get("schedules") == []))
            await expect("not UTF-8", http.post("/v1/list_todos", content=b"\xff\xfe"), 422, "invalid_argument")
            digits = b'{"limit": ' + b"9" * 5000 + b"}"
            await expect("5,000 digits", http.post("/v1/list_todos", content=digits), 422, "invalid_argument")
            rotate = {"webhook_id": w, "new_ingest_token": "true"}
            await expect("string boolean", http.post("/v1/rotate_webhook", json=rotate), 422, "invalid_argument")
            got = await expect("GET on a verb", http.get("/v1/claim"), 405, "method_not_allowed")
            answers.append(("Allow on a 405", got is not None and got.headers.get("allow") == "POST"))
            for name in REGISTRY:
                try:
                    resp = await http.post(f"/v1/{name}", content=very_deep)
                    sweep[f"{resp.status_code} {_code(resp)}"] += 1
                except httpx.HTTPError as exc:
                    sweep[f"no answer ({type(exc).__name__})"] += 1
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, "hostile verb calls", fault)
    wrong = [what for what, ok in answers if not ok]
    failures = sum(v for k, v in sweep.items() if k.startswith("5"))
    out.bound = (
        f"{len(answers)} checks, {len(answers) - len(wrong)} as documented"
        + (f" (not: {', '.join(wrong)})" if wrong else "")
        + f"; every verb with a body 5000 deep: {', '.join(f'{k} ×{v}' for k, v in sorted(sweep.items()))}"
    )
    out.bound_held = not wrong and failures == 0 and set(sweep) <= {"422 too_deep", "429 rate_limited"}
    return out


SCENARIOS: dict[str, Callable[[FaultStack, Counts], Awaitable[Outcome]]] = {
    "worker": worker_kills,
    "temporal": temporal_outage,
    "freeze": temporal_freeze,
    "postgres": postgres_outage,
    "api": api_restarts,
    "storm": duplicate_storm,
    "scaleout": scale_out,
    "slow": slow_clients,
    "hangups": producer_hangups,
    "bodies": hostile_bodies,
    "calls": hostile_calls,
}


# --------------------------------------------------------------------------------------------- reconciliation

RECONCILE_INTERVAL = 10  # seconds between a reconciler's runs in the reconcile row
RECONCILE_VERBS = (
    "create_webhook",
    "claim_next",
    "set_webhook_reconciler",
    "get_webhook_reconciler",
    "clear_webhook_reconciler",
)


def _allow_github(stack: FaultStack, url: str) -> None:
    """Restart every API and worker process allowing the fake GitHub's API URL and a 10 s reconcile interval."""
    extra = {
        "SWITCHBOARD_RECONCILE_API_URLS": url,
        "SWITCHBOARD_RECONCILE_INTERVAL_MIN_SECONDS": str(RECONCILE_INTERVAL),
        "SWITCHBOARD_RECONCILE_REQUEST_GAP_SECONDS": "0.05",
    }
    for proc in stack.workers:
        proc.env.update(extra)
        proc.stop()
        stack.start_worker(proc)
    for proc in stack.apis:
        proc.env.update(extra)
        proc.stop()
        stack.start_api(proc)


def _owner_call(stack: FaultStack, hook: Hook, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(
        f"{stack.base(stack.apis[0])}/v1/{verb}",
        json=body,
        headers={"Authorization": f"Bearer {hook.credential}"},
        timeout=30,
    )
    resp.raise_for_status()
    out: dict[str, Any] = resp.json()
    return out


async def _github_sends(github: FakeGitHub, hook: Any, counts: Counts, stop: asyncio.Event) -> None:
    """`senders` GitHub deliveries at a time, one every `interval` s each, until stopped (never retried)."""

    async def sender(k: int) -> None:
        n = k
        while not stop.is_set():
            await asyncio.to_thread(github.send, hook, issue_body(n, f"reconcile-{n}"))
            n += counts.senders
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), counts.interval)

    await asyncio.gather(*(sender(k) for k in range(counts.senders)))


async def api_down_then_reconcile(stack: FaultStack, counts: Counts) -> Outcome:
    """GitHub sends while the (one) API process is stopped for `api_down` s, then the webhook's reconciler (every
    10 s, a Temporal Schedule) has GitHub redeliver what was refused. **lost** counts every delivery GitHub sent
    that has no event, refused ones included; **other** the refused connections."""
    name = f"API down {counts.api_down:.0f} s, reconcile"
    token = "fake-" + secrets.token_hex(16)
    with fake_github(token) as github:
        await asyncio.to_thread(_allow_github, stack, github.url)
        hook = await asyncio.to_thread(stack.hook, "reconcile", RECONCILE_VERBS)
        api = stack.apis[0]
        ingest = f"{stack.base(api)}/webhooks/w/{hook.token}"
        fake_hook = github.hook("repos/acme/app", ingest, hook.secret, 1)
        await asyncio.to_thread(
            _owner_call,
            stack,
            hook,
            "set_webhook_reconciler",
            {
                "webhook_id": hook.webhook_id,
                "scope": {"repo": "acme/app"},
                "hook_id": 1,
                "token": token,
                "api_url": github.url,
                "interval_seconds": RECONCILE_INTERVAL,
            },
        )
        crashes = len(stack.crashes)
        stop = asyncio.Event()
        sending = asyncio.create_task(_github_sends(github, fake_hook, counts, stop))
        try:
            await asyncio.sleep(counts.lead)
            began = time.time()
            await asyncio.to_thread(api.stop)
            await asyncio.sleep(counts.api_down)
            await asyncio.to_thread(stack.start_api, api)
            back = time.time()
            await asyncio.sleep(counts.tail)
        finally:
            stop.set()
            await sending
        originals = [a for a in fake_hook.attempts if not a.redelivery]
        sent = {a.guid for a in originals}
        deadline = time.monotonic() + 300
        seen: dict[str, tuple[int, float, int]] = {}
        while time.monotonic() < deadline:
            seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
            if sent <= seen.keys():
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2.0)  # settle: a late redelivery would show as doubled
        seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
        state = await asyncio.to_thread(
            _owner_call, stack, hook, "get_webhook_reconciler", {"webhook_id": hook.webhook_id}
        )
        await asyncio.to_thread(_owner_call, stack, hook, "clear_webhook_reconciler", {"webhook_id": hook.webhook_id})
    out = Outcome(name)
    out.sent = len(originals)
    for a in originals:
        if a.status_code == 202:
            out.accepted += 1
        elif a.status_code == 503:
            out.unavailable += 1
        elif a.status_code == 0:
            out.other["no answer (refused)"] += 1
        else:
            out.other[str(a.status_code)] += 1
    out.lost = len(sent - seen.keys())
    out.doubled = sum(1 for n, _, todos in seen.values() if n > 1 or todos > 1)
    out.events = sum(v[0] for v in seen.values())
    out.todos = await asyncio.to_thread(
        stack.count, "SELECT count(*) FROM todos WHERE endpoint_id = %s", hook.endpoint_id
    )
    refused = {a.guid for a in originals if a.status_code != 202}
    landed = [seen[g][1] for g in refused if g in seen]
    out.recovery = max(0.0, max(landed, default=back) - back)
    out.crashes = len(stack.crashes) - crashes
    reconciler = state["reconciler"] or {}
    totals = reconciler.get("totals", {})
    out.notes.append(
        f"API down {back - began:.1f} s; refused {len(refused)}, redelivered by GitHub on request and routed"
        f" {len(refused & seen.keys())}; reconciler totals {totals}, status {reconciler.get('status')}; redelivery"
        f" requests {len(github.redeliveries)} for {len(github.redelivery_counts())} guids"
    )
    if out.lost:
        out.notes.append(f"lost ids (first 5): {', '.join(sorted(sent - seen.keys())[:5])}")
    return out


SCENARIOS["reconcile"] = api_down_then_reconcile
