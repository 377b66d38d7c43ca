"""The worker's liveness file backs the container health check."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cli.main import main
from worker import LIVENESS_FILE, worker_is_alive


def test_worker_health_follows_the_liveness_file(tmp_path: Path, monkeypatch: object) -> None:
    assert worker_is_alive(tmp_path) is False
    (tmp_path / LIVENESS_FILE).touch()
    assert worker_is_alive(tmp_path) is True
    old = time.time() - 120
    os.utime(tmp_path / LIVENESS_FILE, (old, old))
    assert worker_is_alive(tmp_path) is False
    os.environ["SWITCHBOARD_HOME"] = str(tmp_path)
    try:
        assert main(["worker-health"]) == 1
        (tmp_path / LIVENESS_FILE).touch()
        assert main(["worker-health"]) == 0
    finally:
        del os.environ["SWITCHBOARD_HOME"]
