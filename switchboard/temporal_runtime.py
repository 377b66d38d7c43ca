"""The process's one Temporal Runtime: where the SDK's own metrics are served and where core's logs go.

Every client of the process (and every worker built on it) shares this Runtime (switchboard/temporal.py). Its
telemetry is the SDK's own: with `SWITCHBOARD_TEMPORAL_METRICS_PORT` set, the SDK serves its metrics (workflow and
activity latencies, task slots, polls, client requests) in Prometheus format on `SWITCHBOARD_HTTP_HOST`:that port,
from its own exporter (`PrometheusConfig`); unset, they are not exported. Core's own log lines are forwarded into
the ``temporalio.core`` logger, so they join the process's JSON log stream.
"""

from __future__ import annotations

import logging
import threading

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from switchboard.settings import Settings

CORE_LOGGER = "temporalio.core"
"""The Python logger Temporal core's own log lines are forwarded to (so they are JSON lines like every other)."""

_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def core_logging() -> LoggingConfig:
    """Temporal core's logging: forwarded into the ``temporalio.core`` logger instead of written to stderr.

    Left to the SDK default, core writes its own coloured text lines straight to stderr, in the middle of the
    process's JSON stream. Forwarded, each becomes a record of ``temporalio.core`` (its target and fields as
    ``core_target``/``core_fields``), formatted and masked like any other. Core's level follows that logger's
    effective level when the Runtime is made: WARN (the SDK's default) up to INFO, DEBUG with
    SWITCHBOARD_LOG_LEVEL=debug.
    """
    level = logging.getLogger(CORE_LOGGER).getEffectiveLevel()
    # INFO is not passed on as INFO: core's info lines are its own start-up chatter, and the SDK keeps them off too.
    core_level = "DEBUG" if level <= logging.DEBUG else "WARN" if level <= logging.WARNING else "ERROR"
    return LoggingConfig(
        filter=TelemetryFilter(core_level=core_level, other_level="ERROR"),
        forwarding=LogForwardingConfig(
            logger=logging.getLogger(CORE_LOGGER),
            # The target is a field of the line, not part of the logger name or the message.
            append_target_to_name=False,
            prepend_target_on_message=False,
            append_log_fields_to_message=False,
        ),
    )


def sdk_metrics(settings: Settings) -> PrometheusConfig | None:
    """The SDK's Prometheus exporter for these settings, or None when SWITCHBOARD_TEMPORAL_METRICS_PORT is 0.

    Names follow Prometheus conventions: counters end in `_total`, durations are seconds and end in `_seconds`.
    """
    if not settings.temporal_metrics_port:
        return None
    host = f"[{settings.http_host}]" if ":" in settings.http_host else settings.http_host
    return PrometheusConfig(
        bind_address=f"{host}:{settings.temporal_metrics_port}",
        counters_total_suffix=True,
        unit_suffix=True,
        durations_as_seconds=True,
    )


def temporal_runtime(settings: Settings) -> Runtime:
    """The process's one Temporal Runtime, made on first use from these settings.

    A process has one set of settings, so the first call decides; the SDK binds its metrics port then, and a
    port it cannot bind fails that first call (the process does not start half-observed).
    """
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            metrics = sdk_metrics(settings)
            try:
                _runtime = Runtime(telemetry=TelemetryConfig(metrics=metrics, logging=core_logging()))
            except ValueError as exc:
                where = metrics.bind_address if metrics is not None else "none"
                raise RuntimeError(f"SWITCHBOARD_TEMPORAL_METRICS_PORT: cannot serve on {where}: {exc}") from exc
        return _runtime
