"""`switchboard dev` end to end, as a newcomer runs it: embedded stack, CLI vending, a webhook, Ctrl-C, restart;
and as a supervisor, with real processes and pids: a taken port, a SIGKILLed dev, a server that dies, a leftover."""

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
import psutil
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


# --- the supervisor: ports, children, crashes ---


def dev_env(tmp_path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "SWITCHBOARD_HOME": str(tmp_path / "home"),
        "SWITCHBOARD_HTTP_PORT": str(free_port()),
        "SWITCHBOARD_TEMPORAL_PORT": str(free_port()),
        "SWITCHBOARD_TEMPORAL_UI_PORT": str(free_port()),
    }


def descendants(pid: int) -> dict[int, str]:
    """Every process under ``pid`` (servers, their workers, sandbox children), with its command line."""
    return {p.pid: " ".join(p.cmdline()) for p in psutil.Process(pid).children(recursive=True)}


def alive(pid: int) -> bool:
    """Running (a zombie has ended; only its parent has not reaped it yet)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def named(children: dict[int, str], word: str) -> int:
    [pid] = [pid for pid, cmd in children.items() if word in cmd]
    return pid


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_taken_port_refuses_the_start_and_starts_nothing(tmp_path: Path) -> None:
    env = dev_env(tmp_path)
    home = Path(env["SWITCHBOARD_HOME"])
    port = int(env["SWITCHBOARD_TEMPORAL_PORT"])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        out = subprocess.run([str(BIN / "switchboard"), "dev"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"port {port} for the Temporal dev server (SWITCHBOARD_TEMPORAL_PORT) is taken by pid {os.getpid()}" in (
        out.stderr
    )
    assert "nothing was started" in out.stderr and "Switchboard is up" not in out.stdout
    assert not (home / "pg").exists() and not (home / "temporal.db").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(home) in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_sigkilled_dev_leaves_no_child_and_the_next_start_recovers(tmp_path: Path) -> None:
    env = dev_env(tmp_path)
    home = Path(env["SWITCHBOARD_HOME"])
    log = tmp_path / "dev.log"
    proc = start(env, log)
    children = descendants(proc.pid)
    postgres, temporal = named(children, "/postgres -D"), named(children, "start-dev")
    assert str(home / "pg") in children[postgres] and str(home / "temporal.db") in children[temporal]
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: not [pid for pid in children if alive(pid)], 60, f"children outlived dev: {children}")
    # The handle files the crash left are recovered, not trusted: the next start on this home comes up on its own
    # servers and stops cleanly.
    (home / "pg" / ".handle_pids.json").write_text(json.dumps([proc.pid]))
    proc = start(env, log)
    try:
        again = descendants(proc.pid)
        assert named(again, "/postgres -D") not in children and named(again, "start-dev") not in children
        assert not (home / "pg" / ".handle_pids.json").exists()
    finally:
        assert stop(proc) == 0
    wait_until(lambda: not [pid for pid in again if alive(pid)], 60, f"children outlived a clean stop: {again}")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_server_that_dies_stops_the_stack_with_exit_1(tmp_path: Path) -> None:
    env = dev_env(tmp_path)
    log = tmp_path / "dev.log"
    proc = start(env, log)
    children = descendants(proc.pid)
    postgres = named(children, "/postgres -D")
    os.kill(postgres, signal.SIGKILL)
    try:
        assert proc.wait(timeout=120) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert f"PostgreSQL (pid {postgres}) exited (signal SIGKILL); stopping everything" in log.read_text()
    wait_until(lambda: not [pid for pid in children if alive(pid)], 60, f"children outlived dev: {children}")
    # A stale postmaster.pid (its server was SIGKILLed) does not stop the next start.
    proc = start(env, log)
    assert stop(proc) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_an_earlier_run_left_behind_is_stopped_not_reported_as_up(tmp_path: Path) -> None:
    env = dev_env(tmp_path)
    home = Path(env["SWITCHBOARD_HOME"])
    home.mkdir()
    port = int(env["SWITCHBOARD_TEMPORAL_PORT"])
    # An orphan of a crashed run: it holds the Temporal port and names this home's database file, as a dev server
    # an older run left behind would.
    script = "import socket, sys, time\ns = socket.socket()\ns.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\ntime.sleep(600)"
    orphan = subprocess.Popen([sys.executable, "-c", script, str(port), str(home / "temporal.db")])
    log = tmp_path / "dev.log"
    try:
        wait_until(lambda: port_in_use(port), 30, "the orphan never listened")
        proc = start(env, log)
        try:
            assert orphan.wait(timeout=10) != 0
            assert (
                f"stopped pid {orphan.pid}" in log.read_text() and "left running by an earlier run" in log.read_text()
            )
            assert named(descendants(proc.pid), "start-dev")  # Temporal is this run's own
        finally:
            assert stop(proc) == 0
    finally:
        if orphan.poll() is None:
            orphan.kill()
        orphan.wait()


def port_in_use(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False
