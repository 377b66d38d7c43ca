"""OpenTelemetry tracing, on only when an OTLP endpoint is configured (the standard OTEL_* environment variables).

With ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, ``install`` gives the process
a tracer provider that batches spans to that collector over OTLP/HTTP (protobuf), instruments psycopg (one span per
SQL statement), and from then on ``interceptors()`` adds Temporal's ``TracingInterceptor`` to every client
switchboard/temporal.py connects (and so to every worker built on it), and ``instrument_app`` wraps the API in the
FastAPI instrumentation. One trace then runs from the ingest POST through the start of RouteDelivery, the run and
its activities (local ones too), down to the SQL of the commit, across the API and worker processes.

Unset, nothing is installed: no provider, no instrumentation, no interceptor, so the hot path pays one environment
lookup per process, not per request. ``OTEL_SDK_DISABLED=true`` turns it off even with an endpoint set.

The process's first ``install`` names it: ``service.name`` is ``switchboard-api`` or ``switchboard-worker`` (a
process hosting both roles, `switchboard dev` or `switchboard api` with a worker, is the API), unless the operator
set ``OTEL_SERVICE_NAME``. Everything else (headers, timeouts, sampler, batch delays, resource attributes) is the
OpenTelemetry SDK's own reading of the OTEL_* variables.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from switchboard.logs import mask_secrets

log = logging.getLogger("switchboard.tracing")

API = "api"
WORKER = "worker"
SERVICE_PREFIX = "switchboard-"
# /healthz and /metrics are polled every few seconds: spans of them would bury the deliveries.
DEFAULT_EXCLUDED_URLS = "/healthz,/metrics"

_lock = threading.Lock()
_installed: str | None = None


def wanted() -> bool:
    """Whether the environment asks for tracing: an OTLP endpoint is set and the SDK is not disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def installed() -> str | None:
    """The service name tracing was installed under in this process, or None when it is off."""
    return _installed


def install(role: str) -> bool:
    """Install tracing for this process when the environment asks for it; True when tracing is on.

    Idempotent: the first call decides the service name; later calls (the other role of the same process) only
    report. Called before any pool opens (psycopg is instrumented at connect) and before the Temporal client
    connects (the interceptor is chosen at connect).
    """
    global _installed
    with _lock:
        if _installed is not None:
            return True
        if not wanted():
            return False
        # Imported here: a process without an endpoint never loads the SDK, the exporter or the instrumentations.
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        service = os.environ.get("OTEL_SERVICE_NAME", "").strip() or SERVICE_PREFIX + role
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        # Statements only (psycopg's placeholders), never their parameters: values are deliveries' data.
        PsycopgInstrumentor().instrument(tracer_provider=provider, capture_parameters=False)
        _installed = service
    log.info("tracing on: spans of %s go to the OTLP endpoint", service)
    return True


def interceptors() -> list[Any]:
    """Temporal's tracing interceptor when tracing is on (for Client.connect), else nothing."""
    if _installed is None:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


def instrument_app(app: Any) -> bool:
    """Wrap a FastAPI app in the OpenTelemetry middleware when tracing is on (call before the app serves)."""
    if not install(API):
        return False
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        server_request_hook=_mask_span,
        # The SDK's variable wins when the operator set it.
        excluded_urls=None if os.environ.get("OTEL_PYTHON_FASTAPI_EXCLUDED_URLS") else DEFAULT_EXCLUDED_URLS,
        # The per-message receive/send spans of the ASGI instrumentation say nothing a request span does not.
        exclude_spans=["receive", "send"],
    )
    return True


def _mask_span(span: Any, scope: dict[str, Any]) -> None:
    # The request span records the raw path and URL, and an ingest path carries the webhook's credential: masked
    # exactly as a log line is (the span name is the route template, which never holds it).
    if span is None or not span.is_recording():
        return
    for key, value in dict(getattr(span, "attributes", None) or {}).items():
        if isinstance(value, str):
            masked = mask_secrets(value)
            if masked != value:
                span.set_attribute(key, masked)
