"""The stall rows (issue 29, findings 1 and 2): deliveries Temporal cannot carry, and a hung PostgreSQL.

Neither may hold another tenant's deliveries, or any answer, past its bound. Each row runs under the usual load
and sets its bound, measured from outside (the answers, the database, the API's own log) and checked
(`Outcome.bound_held`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from routing.delivery import DeliveryInput
from runtime.relay import PARK_AFTER
from store.db import open_pool
from store.inbox import InboxStore
from switchboard.settings import Settings
from tests.faults.bounds import HEALTH_ADDRESS, log_lines, metric, scrape
from tests.faults.counts import Counts
from tests.faults.processes import frozen_postgres
from tests.faults.producers import Answer, Load, post_delivery
from tests.faults.scenarios import under_load
from tests.faults.stack import FaultStack, Hook
from tests.faults.tally import LATE_SECONDS, Outcome
from tests.helpers import delivery_input

BOUND = Settings.model_fields
MIB = 1024 * 1024

# ------------------------------------------------------------------------------------------ hostile text bodies

TEXT_TENANTS = 3
POISON_BOUND = 30.0  # s from Temporal answering again until every waiting row is started and each poison row settled


def text_bodies() -> dict[str, tuple[str, bytes]]:
    """name → (content type, body): each exactly the ingest cap, of what grows most when escaped as JSON text."""
    floats = b"[" + b",".join([b"1e999"] * ((MIB - 1) // 6)) + b"]"
    return {
        "control": ("text/plain", b"\x01" * MIB),  # a JSON escape makes each byte six: \u0001
        "quotes": ("text/plain", b'"' * MIB),  # two each: \"
        "floats": ("application/json", floats.ljust(MIB, b" ")),  # numbers past a double: infinity
    }


def _poison(hook: Hook, name: str, size: int) -> DeliveryInput:
    """A verified delivery of ``hook`` with a ``size``-byte body, as a receiver would have put it in the inbox."""
    return delivery_input(
        b"x" * size,
        webhook_id=hook.webhook_id,
        endpoint_id=hook.endpoint_id,
        external_id=f"{hook.webhook_id}:{name}-{uuid.uuid4().hex[:12]}",
        received_at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
    )


async def _put_poison(stack: FaultStack, refused: DeliveryInput, oversize: DeliveryInput) -> None:
    """Write both poison rows into the stack's inbox; the oversize one is one failure short of parking."""
    pool = await open_pool(stack.pg.url, max_size=1, pool_timeout=10)
    try:
        inbox = InboxStore(pool)
        for delivery in (refused, oversize):
            await inbox.put(delivery.workflow_id, delivery, "temporal_unavailable")
    finally:
        await pool.close()
    await asyncio.to_thread(
        stack.sql,
        "UPDATE delivery_inbox SET attempts = %s WHERE workflow_id = %s",
        PARK_AFTER - 1,
        oversize.workflow_id,
    )


def _events_of(stack: FaultStack, external_ids: list[str]) -> dict[str, tuple[int, str, str | None]]:
    """external id → (events, disposition, the trace's cause) for these deliveries."""
    rows = stack.sql(
        "SELECT external_id, count(*) OVER (PARTITION BY external_id), disposition, routing_trace->>'cause'"
        " FROM events WHERE external_id = ANY(%s)",
        external_ids,
    )
    return {str(r[0]): (int(r[1]), str(r[2]), r[3]) for r in rows}


async def hostile_text_bodies(stack: FaultStack, counts: Counts) -> Outcome:
    """Under the usual load of another tenant, `TEXT_TENANTS` tenants each send every `text_bodies` body (1 MiB,
    signed) `text_rounds` times; then Temporal is stopped `inbox_wait` s while the load waits in the inbox, and
    two poison rows are written there among it (a body Temporal refuses, one over gRPC's message limit, the
    latter one failure short of parking: its backoff to there takes minutes, tests/api/test_inbox_isolation.py),
    and Temporal is started again. Bound: every text body answered 202
    and one event each (never left pending), none in the inbox or parked; none of the other tenant's
    deliveries sent to the inbox while the text bodies arrived (the API's log); once Temporal answers, every
    waiting row started and each poison row settled (the refused one a faulted event, the other parked, listed
    by `list_parked_deliveries` and in `switchboard_inbox_parked_rows`) within `POISON_BOUND`."""
    hook = await asyncio.to_thread(stack.hook, "text-bodies-load")
    tenants = [await asyncio.to_thread(stack.hook, f"text-bodies-{n}") for n in range(TEXT_TENANTS)]
    tenant_ids = [t.webhook_id for t in tenants]
    poisoner = await asyncio.to_thread(stack.hook, "text-bodies-poison")
    parking = await asyncio.to_thread(stack.has_inbox_parking)
    api = stack.apis[0]
    base = stack.base(api)
    assert stack.temporal is not None
    temporal = stack.temporal
    hostile: list[tuple[str, Answer]] = []  # (external id, answer)
    diversions: Counter[str] = Counter()  # the load's deliveries sent to the inbox while the text bodies arrived
    hostile_diverted = 0  # text bodies sent to the inbox (a start Temporal did not take in time)
    refused = _poison(poisoner, "refused", 2 * MIB)  # base64 over Temporal's 2 MiB payload limit
    oversize = _poison(poisoner, "oversize", 5 * MIB)  # over gRPC's 4 MiB message limit
    settled: dict[str, float] = {}  # what → seconds after Temporal answered again
    waiting: list[str] = []

    async def send(http: httpx.AsyncClient, tenant: Hook) -> None:
        for _ in range(counts.text_rounds):
            for name, (content_type, body) in text_bodies().items():
                delivery = f"{name}-{uuid.uuid4().hex[:12]}"
                answer = await post_delivery(http, base, 0, tenant, delivery, body, content_type)
                hostile.append((f"{tenant.webhook_id}:{delivery}", answer))

    async def settle(back: float) -> None:
        deadline = time.monotonic() + POISON_BOUND * 2
        while time.monotonic() < deadline and len(settled) < (3 if parking else 1):
            if "waiting rows started" not in settled:
                left = await asyncio.to_thread(
                    stack.count, "SELECT count(*) FROM delivery_inbox WHERE workflow_id = ANY(%s)", waiting
                )
                if not left:
                    settled["waiting rows started"] = time.time() - back
            if parking and "refused faulted" not in settled:
                found = await asyncio.to_thread(_events_of, stack, [refused.external_id])
                if found:
                    settled["refused faulted"] = time.time() - back
            if parking and "oversize parked" not in settled:
                parked = await asyncio.to_thread(
                    stack.count,
                    "SELECT count(*) FROM delivery_inbox WHERE workflow_id = %s AND parked_at IS NOT NULL",
                    oversize.workflow_id,
                )
                if parked:
                    settled["oversize parked"] = time.time() - back
            await asyncio.sleep(0.25)

    async def fault(load: Load) -> list[tuple[float, float]]:
        nonlocal hostile_diverted
        offset = api.log.stat().st_size
        began = time.time()
        async with httpx.AsyncClient(timeout=30) as http:
            await asyncio.gather(*(send(http, tenant) for tenant in tenants))
        ended = time.time()
        # A start that failed would send every delivery after it to the inbox for this long: count those too.
        await asyncio.sleep(float(BOUND["ingest_start_backoff_seconds"].default))
        for line in log_lines(api.log, offset):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                if entry["message"] != "delivery accepted into the inbox":
                    continue
                if entry["webhook_id"] == hook.webhook_id:
                    diversions[str(entry.get("reason"))] += 1
                elif entry["webhook_id"] in tenant_ids:
                    hostile_diverted += 1
        stopped = time.time()
        await asyncio.to_thread(temporal.stop)
        if parking:
            await _put_poison(stack, refused, oversize)
        await asyncio.sleep(counts.inbox_wait)
        waiting.extend(
            str(r[0])
            for r in await asyncio.to_thread(
                stack.sql, "SELECT workflow_id FROM delivery_inbox WHERE webhook_id = %s", hook.webhook_id
            )
        )
        await asyncio.to_thread(stack.start_temporal)
        back = time.time()
        await settle(back)
        return [(began, ended), (stopped, back)]

    out = await under_load(stack, hook, counts, f"hostile text bodies ×{TEXT_TENANTS * 3 * counts.text_rounds}", fault)

    # Every text body accepted has its one event (routed or faulted, never pending forever).
    accepted = [ext for ext, a in hostile if a.status == 202]
    deadline = time.monotonic() + 120
    events = await asyncio.to_thread(_events_of, stack, accepted)
    while len(events) < len(accepted) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        events = await asyncio.to_thread(_events_of, stack, accepted)
    # A 202 `pending` is an answer like any 202: the delivery is accepted, and its event must follow.
    answers = Counter(
        "202 pending" if a.pending else str(a.status) if a.status is not None else "no answer" for _, a in hostile
    )
    dispositions = Counter(f"{events[ext][1]}" for ext in accepted if ext in events)
    single = all(events[ext][0] == 1 for ext in events)
    slowest = max((a.took for _, a in hostile), default=0.0)
    left = await asyncio.to_thread(
        stack.count, "SELECT count(*) FROM delivery_inbox WHERE webhook_id = ANY(%s)", tenant_ids
    )

    poison_text = "poison rows: not written (no inbox parking in this code)"
    poison_ok = True
    if parking:
        listed = await asyncio.to_thread(stack.admin, "list_parked_deliveries", {})
        is_listed = any(row["workflow_id"] == oversize.workflow_id for row in listed.get("deliveries", []))
        gauge = metric(await scrape(base), "switchboard_inbox_parked_rows")
        found = await asyncio.to_thread(_events_of, stack, [refused.external_id])
        refused_as = found.get(refused.external_id)
        refused_text = f"{refused_as[1]} ({refused_as[2]})" if refused_as else "no event"
        parked_text = "parked" if "oversize parked" in settled else "not parked"
        poison_text = (
            f"poison rows: refused → {refused_text}, oversize {parked_text}"
            f" (listed {'yes' if is_listed else 'no'}, parked-rows gauge {gauge:.0f})"
        )
        poison_ok = (
            refused_as is not None
            and refused_as[1:] == ("faulted", "start_refused")
            and settled.get("refused faulted", POISON_BOUND + 1) <= POISON_BOUND
            and settled.get("oversize parked", POISON_BOUND + 1) <= POISON_BOUND
            and is_listed
            and gauge >= 1
        )
        # Cleared, so no later row of the campaign meets it (its start can never succeed).
        await asyncio.to_thread(
            stack.sql,
            "DELETE FROM delivery_inbox WHERE workflow_id = %s AND parked_at IS NOT NULL",
            oversize.workflow_id,
        )
    started_in = settled.get("waiting rows started")
    times = ", ".join(f"{k} {v:.1f} s" for k, v in settled.items())
    out.bound = (
        f'{len(hostile)} text bodies of 1 MiB (\\x01, ", [1e999,…]) from {TEXT_TENANTS} tenants: answers'
        f" {', '.join(f'{k} ×{v}' for k, v in sorted(answers.items()))} (slowest {slowest:.2f} s); events"
        f" {', '.join(f'{k} ×{v}' for k, v in sorted(dispositions.items())) or 'none'}"
        f" ({len(accepted) - len(events)} without one); sent to the inbox {hostile_diverted}, left there {left};"
        f" the other tenant's deliveries sent to the inbox meanwhile {sum(diversions.values())}"
        + (f" ({', '.join(f'{k} ×{v}' for k, v in sorted(diversions.items()))})" if diversions else "")
        + f"; Temporal stopped {counts.inbox_wait:g} s with {len(waiting)} of its deliveries waiting, {poison_text};"
        f" after Temporal answered: {times or 'nothing settled'} (bound {POISON_BOUND:g} s)"
    )
    out.bound_held = (
        all(a.status == 202 for _, a in hostile)
        and len(events) == len(accepted)
        and single
        and left == 0
        and not diversions
        and started_in is not None
        and started_in <= POISON_BOUND
        and poison_ok
    )
    return out


# -------------------------------------------------------------------------------------------- postgres frozen

MARGIN = 0.5  # s over a documented bound, for the client's side of the measurement
INGEST_503_BOUND = 2.0  # ingest answers 503 within about 2 s (docs/api.md "Limits")
AFTER_THAW = 5.0  # s after the thaw from which every answer must be a success again


@dataclass
class Probe:
    """One probe's answer: what was asked, when (wall clock), how long it took, the status (None: no answer)."""

    what: str
    started: float
    took: float
    status: int | None


async def postgres_frozen(stack: FaultStack, counts: Counts) -> Outcome:
    """SIGSTOP the PostgreSQL postmaster and every process it forked for `outage` s (at least long enough for a
    verb to reach its bound) under load, while another address probes `list_todos` (as the agent),
    `list_humans` (as admin) and /healthz every half second, each probe on its own. Bound: ingest 503 within
    about 2 s, any other ingest answer within the producer's wait (no later than GitHub's 10 s); each verb answered
    within the pool timeout plus the statement timeout and /healthz within its timeout (+ `MARGIN`); from
    `AFTER_THAW` s after the thaw every answer a success again, with no process restarted."""
    hook = await asyncio.to_thread(stack.hook, "postgres-frozen", ["create_webhook", "claim_next", "list_todos"])
    base = stack.base(stack.apis[0])
    verb_bound = float(BOUND["db_pool_timeout"].default) + float(BOUND["db_statement_timeout"].default)
    health_bound = float(BOUND["health_timeout_seconds"].default)
    wait_bound = float(BOUND["ingest_wait_seconds"].default)
    seconds = max(counts.outage, verb_bound + 1.5)
    probes: list[Probe] = []
    stop = asyncio.Event()
    window: list[float] = []
    loads: list[Load] = []

    async def probing() -> None:
        agent = {"Authorization": f"Bearer {hook.credential}"}
        admin = {"Authorization": f"Bearer {stack.admin_token}"}
        transport = httpx.AsyncHTTPTransport(local_address=HEALTH_ADDRESS)
        async with httpx.AsyncClient(base_url=base, transport=transport, timeout=60) as http:
            calls: dict[str, Callable[[], Awaitable[httpx.Response]]] = {
                "list_todos": lambda: http.post("/v1/list_todos", json={}, headers=agent),
                "list_humans": lambda: http.post("/admin/v1/list_humans", json={}, headers=admin),
                "healthz": lambda: http.get("/healthz"),
            }

            async def one(what: str) -> None:
                started, t0 = time.time(), time.perf_counter()
                try:
                    status: int | None = (await calls[what]()).status_code
                except httpx.HTTPError:
                    status = None
                probes.append(Probe(what, started, time.perf_counter() - t0, status))

            tasks: list[asyncio.Task[None]] = []
            while not stop.is_set():
                tasks.extend(asyncio.create_task(one(what)) for what in calls)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            await asyncio.gather(*tasks)

    async def fault(load: Load) -> list[tuple[float, float]]:
        loads.append(load)
        prober = asyncio.create_task(probing())
        await asyncio.sleep(1.0)
        with frozen_postgres(stack.pg.pid()):
            window.append(time.time())
            await asyncio.sleep(seconds)
            window.append(time.time())
        await asyncio.sleep(AFTER_THAW + 3.0)
        stop.set()
        await prober
        return [(window[0], window[1])]

    out = await under_load(stack, hook, counts, f"PostgreSQL frozen {seconds:.0f} s", fault)
    frozen_at, thawed = window
    answers = loads[0].answers
    ingest_503 = [a.took for a in answers if a.status == 503]
    ingest_other = [a.took for a in answers if a.status != 503]
    after = [a for a in answers if a.started >= thawed + AFTER_THAW]
    kinds: dict[str, list[Probe]] = {}
    for p in probes:
        kinds.setdefault(p.what, []).append(p)

    def summary(what: str, bound: float) -> tuple[str, bool]:
        mine = kinds.get(what, [])
        during = [p for p in mine if frozen_at <= p.started <= thawed]
        later = [p for p in mine if p.started >= thawed + AFTER_THAW]
        statuses = Counter(str(p.status) for p in during)
        slowest = max((p.took for p in mine), default=0.0)
        last_bad = max((p.started - thawed for p in mine if p.started >= thawed and p.status != 200), default=None)
        text = (
            f"{what} begun while frozen {', '.join(f'{k} ×{v}' for k, v in sorted(statuses.items()))}, slowest"
            f" {slowest:.2f} s (bound {bound:g} s + {MARGIN:g}), after the thaw "
            + ("all 200" if last_bad is None else f"last non-200 begun {last_bad:.1f} s after it")
        )
        held = (
            slowest <= bound + MARGIN
            and statuses.get("503", 0) > 0
            and set(statuses) <= {"200", "503"}
            and bool(later)
            and all(p.status == 200 for p in later)
        )
        return text, held

    parts = [summary("list_todos", verb_bound), summary("list_humans", verb_bound), summary("healthz", health_bound)]
    slowest_503 = max(ingest_503, default=0.0)
    slowest_other = max(ingest_other, default=0.0)
    out.bound = (
        f"ingest 503 ×{len(ingest_503)} (slowest {slowest_503:.2f} s, bound {INGEST_503_BOUND:g} s + {MARGIN:g}),"
        f" other answers slowest {slowest_other:.2f} s (bound {wait_bound:g} s + {MARGIN:g}), from {AFTER_THAW:g} s"
        f" after the thaw {sum(a.status == 202 for a in after)}/{len(after)} answered 202; "
        + "; ".join(text for text, _ in parts)
    )
    out.bound_held = (
        slowest_503 <= INGEST_503_BOUND + MARGIN
        and slowest_other <= min(wait_bound + MARGIN, LATE_SECONDS)
        and bool(after)
        and all(a.status == 202 for a in after)
        and all(held for _, held in parts)
        and not out.other
        and out.crashes == 0
    )
    return out
