"""The fault campaign's processes: one OS process each, killable, freezable and restartable by pid.

`Proc` runs `switchboard api`, `switchboard worker` or the Temporal dev server in its own process group;
`Postgres` drives embedded PostgreSQL with pg_ctl, so it stops and starts again on the same data dir and socket.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> None:
    """Block until something accepts connections on 127.0.0.1:port, or raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s")


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


def children_of(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # Field 4 of /proc/<pid>/stat is the parent pid; the command may hold spaces, so split after ')'.
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(proc.name))
    return found


@contextlib.contextmanager
def frozen_postgres(postmaster: int) -> Iterator[list[int]]:
    """A hung PostgreSQL for the block: the postmaster and every process it forked SIGSTOPped (connections are
    neither answered nor refused), all of them SIGCONTinued when the block ends; yields their pids."""
    os.kill(postmaster, signal.SIGSTOP)  # first: a stopped postmaster forks no one after the list is taken
    pids = [postmaster, *children_of(postmaster)]
    try:
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


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
