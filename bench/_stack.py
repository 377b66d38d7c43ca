"""Shared by the benchmarks: start `switchboard dev` in a scratch folder and vend an endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.signing import sign_github

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DevStack:
    base: str
    env: dict[str, str]
    temporal_address: str
    admin_token: str
    home: Path
    pid: int
    """The `switchboard dev` process (API, worker and the servers' parent), for a profiler to attach to."""

    def admin(self, verb: str, body: dict[str, object]) -> dict[str, object]:
        resp = httpx.post(
            f"{self.base}/admin/v1/{verb}", json=body, headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        resp.raise_for_status()
        out: dict[str, object] = resp.json()
        return out

    def vend(self, queues: list[str], verbs: list[str]) -> dict[str, object]:
        human = self.admin("create_human", {"name": "bench"})["human_id"]
        agent = self.admin("create_agent", {"human_id": human, "name": "bench"})["agent_id"]
        return self.admin(
            "vend_endpoint",
            {
                "agent_id": agent,
                "queues": queues,
                "verbs": verbs,
                "webhook_max": 10,
                "webhook_source_types": ["github", "generic"],
                "webhook_queues": queues,
            },
        )


@contextlib.contextmanager
def dev_stack(extra_env: dict[str, str] | None = None, *, defaults: bool = False) -> Iterator[DevStack]:
    """A whole embedded stack in a temporary folder, with ingest and agent rate limits off for load.

    `defaults` keeps the shipped limits and pool size instead (bench/claims.py measures a fleet as installed).
    """
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        home = Path(tmp)
        port, tport = free_port(), free_port()
        env = {
            "PATH": os.environ.get("PATH", ""),
            # Passed on, so a benchmark can run another checkout's code with this venv (before/after figures).
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
            "SWITCHBOARD_HOME": str(home),
            "SWITCHBOARD_HTTP_PORT": str(port),
            "SWITCHBOARD_TEMPORAL_PORT": str(tport),
            "SWITCHBOARD_TEMPORAL_UI_PORT": str(free_port()),
            **(
                {}
                if defaults
                else {
                    "SWITCHBOARD_LOG_LEVEL": "WARNING",
                    "SWITCHBOARD_INGEST_RATE_PER_SECOND": "0",
                    "SWITCHBOARD_AGENT_RATE_PER_SECOND": "0",
                    "SWITCHBOARD_DB_POOL_MAX": "20",
                    # A loaded machine must not turn a slow delivery into `202 pending`: the benchmarks time the
                    # whole path.
                    "SWITCHBOARD_INGEST_WAIT_SECONDS": "60",
                }
            ),
            **(extra_env or {}),
        }
        log = (home / "dev.log").open("ab")
        proc = subprocess.Popen(
            [str(BIN / "switchboard"), "dev"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if proc.poll() is not None:
                    raise RuntimeError((home / "dev.log").read_text())
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("stack did not start")
                time.sleep(0.3)
            token = (home / "admin_token").read_text().strip()
            yield DevStack(base, env, f"127.0.0.1:{tport}", token, home, proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (Linux /proc)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_name(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args if a]
    return " ".join(Path(w).name if i == 0 or "/" in w else w for i, w in enumerate(words[:3]))


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def dumps(value: object) -> str:
    return json.dumps(value, indent=2)


async def drive(n: int, concurrency: int, one: Callable[[int], Awaitable[object]]) -> tuple[float, list[float]]:
    """Run one(i) for i in range(n) on `concurrency` workers; returns elapsed seconds and latencies in ms."""
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def runner() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            await one(i)
            latencies.append((time.perf_counter() - started) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return time.perf_counter() - began, latencies


IDLE_REOPEN_SECONDS = 2.0
"""A keep-alive connection idle this long is reopened before the next request (the server's limit is 5 s)."""


class Wire:
    """One keep-alive HTTP/1.1 connection, doing the least client work a request can take.

    httpx costs its caller about 2.5 ms of CPU a request on this machine, about as much as the API spends
    answering an agent's verb: on 2 shared cores a benchmark would partly measure its own clients. Producers and
    agents run elsewhere, so the benchmarks' default client writes the request bytes and reads status, headers
    and Content-Length bytes back (`--client httpx` keeps httpx for comparison; each bench prints its clients'
    CPU). The server must answer with Content-Length, as the API does.
    """

    def __init__(self, base: str, headers: Mapping[str, str] | None = None) -> None:
        url = httpx.URL(base)
        self.host, self.port = url.host, url.port or 80
        fixed = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def send(
        self, path: str, raw: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``raw`` to ``path``; status, lower-cased headers and body."""
        # A connection the server may have closed meanwhile (uvicorn drops one idle for 5 s) is reopened first:
        # a POST is never sent twice.
        stale = self.reader is None or self.reader.at_eof() or time.monotonic() - self.used > IDLE_REOPEN_SECONDS
        if self.writer is None or stale:
            await self.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.writer.write(
            f"POST {path} HTTP/1.1\r\n{self.head}{extra}Content-Length: {len(raw)}\r\n\r\n".encode() + raw
        )
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        got = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        data = await self.reader.readexactly(int(got["content-length"]))
        self.used = time.monotonic()
        if got.get("connection", "").lower() == "close":
            await self.close()
        return status, got, data

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        """POST ``body`` as JSON."""
        return await self.send(path, json.dumps(body).encode(), {"Content-Type": "application/json"})

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Wires:
    """Keep-alive connections shared by concurrent callers: a call takes an idle one, or opens another."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.idle: list[Wire] = []
        self.every: list[Wire] = []

    async def send(
        self, path: str, raw: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        wire = self.idle.pop() if self.idle else None
        if wire is None:
            wire = Wire(self.base)
            self.every.append(wire)
        try:
            out = await wire.send(path, raw, headers)
        except BaseException:
            await wire.close()
            raise
        self.idle.append(wire)
        return out

    async def aclose(self) -> None:
        for wire in self.every:
            await wire.close()


Poster = httpx.AsyncClient | Wires


@contextlib.asynccontextmanager
async def wires_or_httpx(base: str, client: str, concurrency: int) -> AsyncIterator[Poster]:
    """The producers' HTTP client for ``--client raw|httpx``."""
    if client == "httpx":
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency * 2)) as http:
            yield http
        return
    wires = Wires(base)
    try:
        yield wires
    finally:
        await wires.aclose()


async def post_signed_issue(http: Poster, url: str, secret: bytes, body: bytes) -> None:
    """POST a signed GitHub `issues` delivery with a fresh delivery id; it must mint exactly one todo."""
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": uuid.uuid4().hex, "Content-Type": "application/json"}
    headers.update(sign_github(secret, body))
    if isinstance(http, Wires):
        status, _, data = await http.send(httpx.URL(url).raw_path.decode(), body, headers)
    else:
        resp = await http.post(url, content=body, headers=headers)
        status, data = resp.status_code, resp.content
    assert status == 202 and json.loads(data).get("created") == 1, data[:300]


@contextlib.contextmanager
def profiled(pid: int, out: str | None, *, gil: bool = False) -> Iterator[None]:
    """py-spy on process ``pid`` for the block; its top functions by own time go to ``out`` (None: no profile).

    ``gil``: sample only the thread holding the GIL, so shares are of the process's Python CPU (threads that wait,
    such as the SDK's idle workflow-task threads, are otherwise counted as busy); native threads do not show.
    """
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if out is None:
        yield
        return
    folded = out + ".folded"
    proc = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--output",
            folded,
            "--rate",
            "200",
            "--nonblocking",
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)
    try:
        yield
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)
        Path(out).write_text(top_functions(Path(folded)))


def top_functions(folded: Path, n: int = 30) -> str:
    """Own and total sample counts per function, from py-spy's collapsed stacks (own time first)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        k = int(count)
        samples += k
        frames = stack.split(";")
        own[frames[-1]] += k
        for frame in set(frames):
            total[frame] += k
    lines = [f"{samples} samples; own% total% function"]
    for frame, k in own.most_common(n):
        lines.append(f"{100 * k / samples:5.1f} {100 * total[frame] / samples:5.1f}  {frame}")
    lines.append("")
    lines.append("by total (inclusive):")
    for frame, k in total.most_common(n):
        lines.append(f"{100 * k / samples:5.1f}  {frame}")
    return "\n".join(lines) + "\n"
