"""The README's first-webhook walkthrough, run as written: its shell block against a real `switchboard dev`.

The block is found by its marker (`<!-- walkthrough: first-webhook -->` and the fenced block after it), wherever
the README puts it. It runs in bash from the folder `switchboard dev` runs in, as a newcomer's second shell does
(`.venv/bin` on PATH, the admin token found in `./.switchboard/admin_token`); the only settings are the free
ports the test gives both.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- walkthrough: first-webhook -->"
BIN = Path(sys.executable).parent


def walkthrough(text: str) -> str:
    """The fenced sh block right after the marker."""
    found = re.compile(r"\s*```sh\n(.*?)```", re.S).match(text, text.index(MARKER) + len(MARKER))
    assert found is not None, f"no ```sh block follows {MARKER}"
    return found.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            return conn.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def test_the_block_is_found_by_its_marker_and_the_docs_show_the_same() -> None:
    block = walkthrough((ROOT / "README.md").read_text())
    assert walkthrough((ROOT / "docs" / "getting-started.md").read_text()) == block
    assert "switchboard send github" in block and "--export" in block
    assert "curl" not in block and "sbk_…" not in block  # nothing to copy by hand


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    block = walkthrough((ROOT / "README.md").read_text())
    port = free_port()
    env = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "SWITCHBOARD_HTTP_PORT": str(port),
        "SWITCHBOARD_TEMPORAL_PORT": str(free_port()),
        "SWITCHBOARD_TEMPORAL_UI_PORT": str(free_port()),
    }
    log = tmp_path / "dev.log"
    dev = subprocess.Popen(
        [str(BIN / "switchboard"), "dev"],
        cwd=tmp_path,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not healthy(port):
            assert dev.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "switchboard dev did not become healthy:\n" + log.read_text()
            time.sleep(0.3)
        # The block as written, then what it left behind: the todo it completed and the variables it exported.
        script = (
            "set -euo pipefail\n"
            + block
            + '\nswitchboard todos get "$TODO_ID" --json > final.json\n'
            + 'printf "%s\\n" "$HUMAN_ID" "$AGENT_ID" "$WEBHOOK_ID" "$SWITCHBOARD_INGEST_URL" > exported.txt\n'
        )
        done = subprocess.run(
            ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr and "switchboard: " not in done.stderr, done.stderr
        # The producer's verdict is printed where a person sees it.
        assert "HTTP 202 Accepted" in done.stderr
        final = json.loads((tmp_path / "final.json").read_text())["todo"]
        assert final["state"] == "done" and final["queue"] == "work"
        assert final["title"] == "github issues opened: acme/app#1 Hello from switchboard send"
        human, agent, webhook, ingest = (tmp_path / "exported.txt").read_text().split()
        assert human.startswith("hu_") and agent.startswith("ag_") and webhook.startswith("wh_")
        assert ingest.startswith(f"http://localhost:{port}/webhooks/w/")
        # The events listing showed the delivery with its todo, by the delivery id the README searches for.
        assert final["id"] in done.stdout
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        try:
            dev.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
