"""`switchboard dev` end to end, as a newcomer runs it: embedded stack, CLI vending, a webhook, Ctrl-C, restart."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(env: dict[str, str], *args: str) -> Any:
    out = subprocess.run(
        [str(BIN / "switchboard"), *args], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [str(BIN / "switchboard"), "dev"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{env['SWITCHBOARD_HTTP_PORT']}/healthz"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("dev stack did not become healthy:\n" + log.read_text())


def stop(proc: subprocess.Popen[bytes]) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


@pytest.mark.slow
@pytest.mark.timeout(600)  # two cold starts (up to 90 s each) and two graceful stops (up to 60 s each)
def test_dev_stack_from_scratch_then_restart_keeps_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SWITCHBOARD_HOME": str(home),
        "SWITCHBOARD_HTTP_PORT": str(port),
        "SWITCHBOARD_TEMPORAL_PORT": str(free_port()),
        "SWITCHBOARD_TEMPORAL_UI_PORT": str(free_port()),
    }
    log = tmp_path / "dev.log"
    proc = start(env, log)
    try:
        text = log.read_text()
        assert f"http://localhost:{port}/docs" in text and "Admin token" in text and "Temporal UI" in text
        # The hosted worker is the whole worker role: its liveness file backs `switchboard worker-health`.
        health = subprocess.run([str(BIN / "switchboard"), "worker-health"], env=env, capture_output=True, timeout=60)
        assert health.returncode == 0, health.stdout
        human = cli(env, "human", "create", "--name", "joe")["human_id"]
        agent = cli(env, "agent", "create", "--human", human, "--name", "bot")["agent_id"]
        endpoint = cli(env, "endpoint", "vend", "--agent", agent, "--queues", "work")
        auth = {"Authorization": f"Bearer {endpoint['credential']}"}
        base = f"http://127.0.0.1:{port}"
        webhook = httpx.post(
            f"{base}/v1/create_webhook", json={"source_type": "github", "target_queue": "work"}, headers=auth
        ).json()
        body = json.dumps(
            {"action": "opened", "issue": {"number": 1, "title": "hi"}, "repository": {"full_name": "a/b"}}
        ).encode()
        sig = "sha256=" + hmac.new(webhook["secret"].encode(), body, hashlib.sha256).hexdigest()
        ingest = webhook["ingest_url"].replace("localhost", "127.0.0.1")
        resp = httpx.post(
            ingest,
            content=body,
            headers={"X-Hub-Signature-256": sig, "X-GitHub-Event": "issues", "X-GitHub-Delivery": "d1"},
            timeout=30,
        )
        assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
    finally:
        assert stop(proc) == 0
    assert (home / "pg").is_dir() and (home / "temporal.db").exists()
    # The dev server keeps its file with a write-ahead log, synced per commit (cli/embedded.py SQLITE_PRAGMAS).
    with contextlib.closing(sqlite3.connect(home / "temporal.db")) as store:
        assert store.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    # One log format: no colour codes in the stack's stream (Temporal core's lines are forwarded as JSON), and the
    # dev server's own log is JSON lines, without its start-up banner.
    assert "\x1b[" not in log.read_text()
    server_log = (home / "temporal.log").read_text()
    assert "\x1b[" not in server_log and "Temporal CLI" not in server_log
    assert all(isinstance(json.loads(line), dict) for line in server_log.splitlines() if line.strip())

    proc = start(env, log)
    try:
        claimed = httpx.post(f"{base}/v1/claim_next", json={}, headers=auth).json()
        assert claimed["todo"]["title"].endswith("a/b#1 hi")
        assert (
            httpx.post(f"{base}/v1/complete", json={"todo_id": claimed["todo"]["id"]}, headers=auth).json()["todo"][
                "state"
            ]
            == "done"
        )
    finally:
        assert stop(proc) == 0
