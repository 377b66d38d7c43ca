"""Shared by the benchmarks: start `switchboard dev` in a scratch folder and vend an endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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


async def post_signed_issue(http: httpx.AsyncClient, url: str, secret: bytes, body: bytes) -> None:
    """POST a signed GitHub `issues` delivery with a fresh delivery id; it must mint exactly one todo."""
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": uuid.uuid4().hex, "Content-Type": "application/json"}
    headers.update(sign_github(secret, body))
    resp = await http.post(url, content=body, headers=headers)
    assert resp.status_code == 202 and resp.json().get("created") == 1, resp.text
