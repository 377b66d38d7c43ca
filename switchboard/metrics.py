"""Prometheus metrics: every metric object of the process, the Temporal SDK bridge, and the database gauges.

One place per idea: api/, activities/ and the worker import the objects below and record at the one spot an
outcome becomes known. Workflow code never records (it must stay deterministic and replays): outcomes of a
RouteDelivery run are recorded by its activities. Labels are bounded sets (source types, decisions, causes,
HTTP statuses, queue names an operator configured), never ids.

Everything lands in prometheus-client's default registry, so one process has one registry: the API serves it
on `GET /metrics` (api/metrics.py), a worker process on its own small listener (`SWITCHBOARD_WORKER_METRICS_PORT`),
and `switchboard dev`, which hosts both in one process, on the API's endpoint.

The Temporal SDK's own metrics (workflow and activity latencies, task slots, polls, client requests) reach the
same registry through a `MetricBuffer` on the process's one Temporal `Runtime` (``temporal_runtime``), which
``TemporalMetrics`` drains into Prometheus families. The SDK's alternative, `PrometheusConfig`, serves its own
HTTP port from Rust: a second listener per process next to the API's, a second scrape target per process, and
in `switchboard dev` two endpoints for one process. The buffer keeps one endpoint and one registry.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import Metric
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BufferedMetricUpdate,
    LogForwardingConfig,
    LoggingConfig,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

log = logging.getLogger("switchboard.metrics")

# `_created` companions of every counter would double the series for nothing a dashboard uses.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")


def bounded(value: object, default: str = "other") -> str:
    """A label value as given when it is short and plain, else `default`: a label can never carry free text."""
    text = str(value) if value is not None else ""
    return text if _LABEL_VALUE.match(text) else default


# --- application metrics -------------------------------------------------------------------------------------

BUILD = Info("switchboard_build", "Switchboard build that serves these metrics.")
BUILD.info({"version": "0.1.0"})

INGEST_REQUESTS = Counter(
    "switchboard_ingest_requests",
    "Ingest requests answered, by the webhook's source type (unknown before the token resolves) and HTTP status.",
    ["source", "status"],
)
INGEST_DURATION = Histogram(
    "switchboard_ingest_duration_seconds",
    "Time from an ingest request's arrival to its answer, by source type.",
    ["source"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
DELIVERIES = Counter(
    "switchboard_deliveries",
    "Deliveries decided by RouteDelivery, by source type and decision"
    " (routed, dropped, repeat, faulted, quarantined, duplicate, gone, no_targets).",
    ["source", "decision"],
)
RULE_FAULTS = Counter(
    "switchboard_rule_faults",
    "Rule faults on committed deliveries, by cause (error, timeout, compile_error, budget_exhausted,"
    " sandbox_busy, sandbox_failure).",
    ["cause"],
)
SANDBOX_KILLS = Counter(
    "switchboard_sandbox_kills",
    "Sandbox children killed or lost mid-evaluation, by pool (delivery, rule_test) and reason"
    " (timeout, budget, hard_deadline, died, died_parsing, died_compiling, violation).",
    ["pool", "reason"],
)
SANDBOX_BUSY = Counter(
    "switchboard_sandbox_busy",
    "Evaluations or save-time compiles that found no free sandbox slot in time, by pool.",
    ["pool"],
)
EVALUATIONS = Counter(
    "switchboard_evaluations",
    "Rule evaluations of deliveries run, by path: local (a free sandbox child of the run's worker), queue (the"
    " fair evaluate queue, when no child was free).",
    ["path"],
)
INBOX_PARKED = Counter(
    "switchboard_inbox_parked",
    "Inbox rows parked by a relay: their start kept failing while Temporal answered (see switchboard_inbox_parked_rows).",
)
CLAIMS = Counter("switchboard_claims", "Todos claimed (claim and claim_next), by queue.", ["queue"])
LEASE_EXPIRIES = Counter(
    "switchboard_lease_expiries",
    "Claimed todos whose lease expired, found by the reaper (requeued or dead-lettered).",
)
DEAD_LETTERS = Counter(
    "switchboard_dead_letters",
    "Todos dead-lettered at the attempt cap, by cause (failed: the agent failed it; lease_expired: the reaper).",
    ["cause"],
)
DOORBELL_RINGS = Counter(
    "switchboard_doorbell_rings", "Doorbell rings handed to an open stream, by transport (sse, mcp).", ["transport"]
)
DOORBELL_DROPS = Counter(
    "switchboard_doorbell_drops",
    "Doorbell rings dropped because the chosen stream's buffer was full, by transport (the todo stays pending).",
    ["transport"],
)
HTTP_CONNECTIONS = Gauge(
    "switchboard_http_connections", "HTTP connections open on this API process (admitted by api/connections.py)."
)
HTTP_CONNECTIONS_CUT = Counter(
    "switchboard_http_connections_cut",
    "HTTP connections refused or closed by a client bound, by reason: per_address and global (refused at a"
    " connection cap), evicted (the oldest connection still waiting for its request head, closed to make room at"
    " the global cap), head_timeout and body_timeout (a request not read in time), head_too_large.",
    ["reason"],
)

TRIAGE_CALLS = Counter(
    "switchboard_llm_triage_calls",
    "LLM triage activity runs, by provider and outcome (answered, llm_timeout, llm_error, budget_exhausted:"
    " refused before any call).",
    ["provider", "outcome"],
)
TRIAGE_LATENCY = Histogram(
    "switchboard_llm_triage_call_seconds",
    "Time of one model call of LLM triage (budget check excluded), by provider.",
    ["provider"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
)
TRIAGE_DECISIONS = Counter(
    "switchboard_llm_triage_decisions",
    "Committed deliveries that reached LLM triage, by its outcome on the trace (chosen, llm_rejected,"
    " llm_low_confidence, llm_timeout, llm_error, budget_exhausted).",
    ["outcome"],
)


RECONCILE_RUNS = Counter(
    "switchboard_reconcile_runs",
    "Reconciler runs (GitHub's delivery log against Switchboard), by how they ended: ok, rate_limited,"
    " unauthorized, forbidden, not_found, unavailable, error, disabled (the operator's switch), gone.",
    ["status"],
)
RECONCILE_DELIVERIES = Counter(
    "switchboard_reconcile_deliveries",
    "GitHub deliveries a reconciler handled, by outcome: seen (attempts examined), missing (Switchboard never"
    " got the guid), requested (a redelivery asked for), arrived (a requested redelivery reached Switchboard),"
    " given_up (GitHub no longer redelivers it).",
    ["outcome"],
)
RECONCILE_CALLS = Counter(
    "switchboard_reconcile_api_calls",
    "Calls to GitHub's delivery API, by call (list, redeliver) and outcome (ok, rate_limited, unauthorized,"
    " forbidden, not_found, unavailable, error, refused).",
    ["call", "outcome"],
)


def record_reconcile(outcome: str, count: int = 1) -> None:
    """Deliveries a reconciler handled with this outcome (seen, missing, requested, arrived, given_up)."""
    if count:
        RECONCILE_DELIVERIES.labels(outcome=bounded(outcome)).inc(count)


def record_triage_call(provider: str, outcome: str, seconds: float | None) -> None:
    """One run of the triage activity; ``seconds`` is the model call's time when a call was made."""
    label = bounded(provider)
    TRIAGE_CALLS.labels(provider=label, outcome=bounded(outcome)).inc()
    if seconds is not None:
        TRIAGE_LATENCY.labels(provider=label).observe(seconds)


def record_triage_decision(llm: object) -> None:
    """The triage outcome on a committed delivery's trace (its ``llm`` record), if it reached triage."""
    if isinstance(llm, Mapping):
        TRIAGE_DECISIONS.labels(outcome=bounded(llm.get("outcome"))).inc()


def record_ingest(source: str | None, status: int, seconds: float) -> None:
    """One answered ingest request."""
    label = bounded(source, "unknown")
    INGEST_REQUESTS.labels(source=label, status=str(status)).inc()
    INGEST_DURATION.labels(source=label).observe(seconds)


def record_connection_cut(reason: str) -> None:
    """One HTTP connection refused or closed by a client bound (api/connections.py)."""
    HTTP_CONNECTIONS_CUT.labels(reason=bounded(reason)).inc()


def record_delivery(source: str, decision: str, faults: Iterable[Mapping[str, Any]] = ()) -> None:
    """One decided delivery and the rule faults on its trace."""
    DELIVERIES.labels(source=bounded(source), decision=bounded(decision)).inc()
    for fault in faults:
        RULE_FAULTS.labels(cause=bounded(fault.get("cause"))).inc()


def record_evaluation(path: str) -> None:
    """One delivery's rule evaluation run on ``path`` (local, queue)."""
    EVALUATIONS.labels(path=bounded(path)).inc()


def record_inbox_parked() -> None:
    """One inbox row parked by a relay."""
    INBOX_PARKED.inc()


def sandbox_observer(pool: str) -> Callable[[str], None]:
    """The callback a SandboxPool reports to: "busy", or the reason a child was killed or lost."""
    name = bounded(pool)

    def observe(event: str) -> None:
        if event == "busy":
            SANDBOX_BUSY.labels(pool=name).inc()
        else:
            SANDBOX_KILLS.labels(pool=name, reason=bounded(event)).inc()

    return observe


# --- the Temporal SDK's metrics --------------------------------------------------------------------------------

# Durations arrive in seconds (MetricBufferDurationFormat.SECONDS); the SDK's latencies span a poll (ms) to a
# long workflow (minutes).
TEMPORAL_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
_BUFFER_SIZE = 100_000
_DRAIN_SECONDS = 1.0

Labels = tuple[tuple[str, str], ...]


@dataclass
class _Family:
    """The accumulated state of one SDK metric: counter totals, gauge values or histogram buckets per label set."""

    kind: int
    name: str
    documentation: str
    values: dict[Labels, float] = field(default_factory=dict)
    buckets: dict[Labels, list[float]] = field(default_factory=dict)
    sums: dict[Labels, float] = field(default_factory=dict)


class TemporalMetrics:
    """A prometheus-client collector fed by the Temporal Runtime's MetricBuffer.

    The buffer is drained every second by a daemon thread (it drops updates once full) and again at every
    scrape, so a scrape sees everything recorded before it. Counters are totals of the buffered deltas, gauges
    their last value, histograms cumulative buckets over ``TEMPORAL_BUCKETS``. Names follow Prometheus
    conventions: counters end in `_total`, duration histograms in `_seconds`.
    """

    def __init__(self, buffer: MetricBuffer, buckets: Sequence[float] = TEMPORAL_BUCKETS) -> None:
        self._buffer = buffer
        self._bounds = tuple(buckets)
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()
        # Label tuples by attribute set: the SDK reports a few dozen sets, each for every update (bounded anyway).
        self._label_cache: dict[tuple[tuple[str, type, Any], ...], Labels] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Drain in the background for the life of the process."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="temporal-metrics", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_DRAIN_SECONDS):
            try:
                self.drain()
            except Exception:  # a bad update must not end the drain: the buffer would fill and drop
                log.exception("draining Temporal SDK metrics failed")

    def drain(self) -> None:
        """Fold every buffered update into the families."""
        with self._lock:
            for update in self._buffer.retrieve_updates():
                self._apply(update)

    def _apply(self, update: BufferedMetricUpdate) -> None:
        metric = update.metric
        family = self._families.get(metric.name)
        if family is None:
            family = self._families[metric.name] = _Family(
                kind=metric.kind,
                name=_prometheus_name(metric.name, metric.kind, metric.unit),
                documentation=metric.description or metric.name,
            )
        key = tuple((k, type(v), v) for k, v in update.attributes.items())
        labels = self._label_cache.get(key)
        if labels is None:
            if len(self._label_cache) >= _LABEL_CACHE_MAX:
                self._label_cache.clear()
            labels = self._label_cache[key] = _labels(update.attributes)
        value = float(update.value)
        if family.kind == BUFFERED_METRIC_KIND_COUNTER:
            family.values[labels] = family.values.get(labels, 0.0) + value
        elif family.kind == BUFFERED_METRIC_KIND_GAUGE:
            family.values[labels] = value
        else:
            # Per bucket (the first bound >= value; the last slot is past every bound): cumulated when rendered.
            counts = family.buckets.get(labels)
            if counts is None:
                counts = family.buckets[labels] = [0.0] * (len(self._bounds) + 1)
            counts[bisect.bisect_left(self._bounds, value)] += 1
            family.sums[labels] = family.sums.get(labels, 0.0) + value

    def describe(self) -> list[Metric]:
        """Nothing to declare up front: the SDK decides its metric names."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Prometheus families of everything the SDK recorded so far."""
        self.drain()
        with self._lock:
            families = [self._render(family) for family in self._families.values()]
        yield from families

    def _render(self, family: _Family) -> Metric:
        if family.kind == BUFFERED_METRIC_KIND_COUNTER:
            out = Metric(family.name, family.documentation, "counter")
            for labels, value in family.values.items():
                out.add_sample(family.name + "_total", dict(labels), value)
            return out
        if family.kind == BUFFERED_METRIC_KIND_GAUGE:
            out = Metric(family.name, family.documentation, "gauge")
            for labels, value in family.values.items():
                out.add_sample(family.name, dict(labels), value)
            return out
        out = Metric(family.name, family.documentation, "histogram")
        for labels, counts in family.buckets.items():
            base = dict(labels)
            total = 0.0
            for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
                total += count
                out.add_sample(family.name + "_bucket", {**base, "le": _le(bound)}, total)
            out.add_sample(family.name + "_count", base, total)
            out.add_sample(family.name + "_sum", base, family.sums[labels])
        return out


def _prometheus_name(name: str, kind: int, unit: str | None) -> str:
    name = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    if kind == BUFFERED_METRIC_KIND_COUNTER:
        return name.removesuffix("_total")
    if unit in ("s", "seconds") and not name.endswith("_seconds"):
        return name + "_seconds"
    return name


_LABEL_CACHE_MAX = 10_000
_NOT_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def _labels(attributes: Mapping[str, Any]) -> Labels:
    # Booleans as Prometheus spells them; every value as text.
    items = []
    for key, value in attributes.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        items.append((_NOT_LABEL.sub("_", key), text))
    return tuple(sorted(items))


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()
TEMPORAL: TemporalMetrics | None = None


CORE_LOGGER = "temporalio.core"
"""The Python logger Temporal core's own log lines are forwarded to (so they are JSON lines like every other)."""


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


def temporal_runtime() -> Runtime:
    """The process's one Temporal Runtime, whose SDK metrics land in this registry and whose core logs join the
    process's log stream (created on first use)."""
    global _runtime, TEMPORAL
    with _runtime_lock:
        if _runtime is None:
            buffer = MetricBuffer(_BUFFER_SIZE, MetricBufferDurationFormat.SECONDS)
            _runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer, logging=core_logging()))
            TEMPORAL = TemporalMetrics(buffer)
            REGISTRY.register(TEMPORAL)
            TEMPORAL.start()
        return _runtime


# --- database gauges (API processes) ------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseSnapshot:
    """State of the shared database that no single process counts: the inbox and the live todos."""

    inbox_depth: int
    inbox_due: int
    inbox_parked: int
    inbox_oldest_age_seconds: float
    inbox_lag_seconds: float
    # (queue, state) -> count, live states only (pending, claimed, failed awaiting a retry).
    todos: Mapping[tuple[str, str], int]


class DatabaseGauges:
    """Gauges read from PostgreSQL at scrape time, cached for ``ttl`` seconds and bounded by ``timeout``.

    Every API process reports the same values (they are the database's, not the process's): aggregate with
    `max`, not `sum`. A scrape while PostgreSQL does not answer in time still answers, with these gauges left
    out and `switchboard_metrics_database_up` 0.
    """

    def __init__(
        self, fetch: Callable[[], Awaitable[DatabaseSnapshot]], *, ttl: float = 5.0, timeout: float = 1.0
    ) -> None:
        self._fetch = fetch
        self.ttl = ttl
        self.timeout = timeout
        self._snapshot: DatabaseSnapshot | None = None
        self._taken = float("-inf")
        self._up = False
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the database unless the cached snapshot is younger than the ttl."""
        async with self._lock:
            if time.monotonic() - self._taken < self.ttl:
                return
            try:
                async with asyncio.timeout(self.timeout):
                    self._snapshot = await self._fetch()
                self._up = True
            except Exception as exc:
                log.warning("metrics: database gauges unavailable (%s)", type(exc).__name__)
                self._snapshot, self._up = None, False
            self._taken = time.monotonic()

    def describe(self) -> list[Metric]:
        """Not registered in the process registry: each API app renders its own."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The cached snapshot as gauges."""
        up = Metric("switchboard_metrics_database_up", "1 when the last database gauge read succeeded.", "gauge")
        up.add_sample("switchboard_metrics_database_up", {}, 1.0 if self._up else 0.0)
        yield up
        snap = self._snapshot
        if snap is None:
            return
        for name, doc, value in (
            ("switchboard_inbox_depth", "Deliveries waiting in the PostgreSQL inbox.", snap.inbox_depth),
            ("switchboard_inbox_due", "Inbox rows due for the relay now.", snap.inbox_due),
            (
                "switchboard_inbox_parked_rows",
                "Inbox rows parked until an operator requeues them (their start kept failing).",
                snap.inbox_parked,
            ),
            (
                "switchboard_inbox_oldest_age_seconds",
                "Age of the oldest inbox row (0 when empty).",
                snap.inbox_oldest_age_seconds,
            ),
            ("switchboard_inbox_lag_seconds", "How long the oldest due row has been due.", snap.inbox_lag_seconds),
        ):
            gauge = Metric(name, doc, "gauge")
            gauge.add_sample(name, {}, float(value))
            yield gauge
        todos = Metric("switchboard_todos", "Live todos by queue and state (pending, claimed, failed).", "gauge")
        for (queue, state), count in sorted(snap.todos.items()):
            todos.add_sample("switchboard_todos", {"queue": queue, "state": state}, float(count))
        yield todos


# --- the worker's listener ------------------------------------------------------------------------------------


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[int | None]:
    """Serve the process registry on host:port (any path) for the life of the block; port 0 serves nothing.

    prometheus-client's own threaded server: the worker process has no HTTP server of its own, and a scrape runs
    in that thread, never on the worker's event loop. Yields the bound port (None when off).
    """
    if not port:
        yield None
        return
    temporal_runtime()  # the SDK metrics are part of what a worker serves, even before its client connects
    server, thread = start_http_server(port, addr=host)
    log.info("metrics listening on %s:%d", host, server.server_port)
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
