"""Prometheus metrics of the process: every application metric object and the one call that records each outcome.

The import surface for recording: api/, activities/, runtime/ and the worker import the objects and `record_*`
functions below and record at the one spot an outcome becomes known. Workflow code never records (it must stay
deterministic and replays): outcomes of a RouteDelivery run are recorded by its activities. Labels are bounded
sets (source types, decisions, causes, HTTP statuses, queue names an operator configured), never ids; `bounded`
makes any other value `other`.

Everything lands in prometheus-client's default registry, so one process has one registry: the API serves it on
`GET /metrics` with its database gauges (api/metrics.py, switchboard/metrics_database.py), a worker process on its
own small listener (switchboard/metrics_listener.py, `SWITCHBOARD_WORKER_METRICS_PORT`), and `switchboard dev`,
which hosts both in one process, on the API's endpoint. The Temporal SDK's own metrics are served by the SDK on
their own port (switchboard/temporal_runtime.py, `SWITCHBOARD_TEMPORAL_METRICS_PORT`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Info, disable_created_metrics

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
