"""The servers the suite starts end with it, however it ends: a killed test run leaves no PostgreSQL or Temporal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import asyncio, sys, time
from pathlib import Path
from cli.embedded import start_postgres
from tests.conftest import start_temporal

async def main():
    env = await start_temporal()
    server, _ = start_postgres(Path(sys.argv[1]), "postgres")
    print(env.proc.pid, server.proc.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_test_run_killed_with_sigkill_leaves_no_server_behind(tmp_path: Path) -> None:
    run = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "pg")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.stdout is not None
    line = run.stdout.readline().decode()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2 and all(alive(p) for p in pids), line
    run.send_signal(signal.SIGKILL)
    run.wait()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running after the run was killed: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)
