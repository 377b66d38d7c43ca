"""The fault campaign's counts: after recovery, exactly from the database, per scenario.

`tally` waits for recovery, then counts: lost (a 202 whose delivery id has no event), doubled (more than one event
or todo per delivery id), "created" answers per id, recovery time (fault end → every delivery accepted before it
has its event).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from tests.faults.producers import Answer
from tests.faults.stack import FaultStack, Hook

LATE_SECONDS = 10.0  # GitHub gives up on a delivery after 10 s


@dataclass
class Outcome:
    """One scenario's counts, exact from the database after recovery."""

    name: str
    sent: int = 0
    accepted: int = 0  # 202
    unavailable: int = 0  # 503
    other: Counter[str] = field(default_factory=Counter)  # other statuses, and "no answer" by error type
    pending: int = 0
    late: int = 0  # answered after GitHub's 10 s
    lost: int = 0
    doubled: int = 0
    created_answers: dict[str, int] = field(default_factory=dict)  # per delivery id
    pending_ids: set[str] = field(default_factory=set)  # ids with at least one `202 pending` answer
    first_said_duplicate: int = 0  # a delivery sent once, answered duplicate (misreported)
    stored_unacked: int = 0  # an event exists though the producer was told it failed
    recovery: float | None = None  # seconds, fault end → every delivery accepted before it has its event
    unavailable_outside_fault: int = 0  # 503s to requests that began after the fault ended (or ended before it)
    last_unavailable_after: float | None = None  # seconds after the fault ended that the last such request began
    inbox_left: int | None = None
    crashes: int = 0
    events: int = 0
    todos: int = 0
    rings: int | None = None  # scale-out: rings received by the SSE clients, all APIs together
    ring_dups: int | None = None  # a todo rung more than once
    unrung: int | None = None  # a todo no client was rung for
    notes: list[str] = field(default_factory=list)
    bound: str = ""  # what the scenario holds its clients or its inputs to, as measured (the client-bound rows)
    bound_held: bool | None = None  # None: the row has no such bound

    @property
    def stranded(self) -> int:
        """Deliveries answered 202 still waiting in the accept-first inbox after recovery."""
        return self.inbox_left or 0

    def row(self) -> str:
        rec = "-" if self.recovery is None else f"{self.recovery:.1f}"
        other = sum(self.other.values())
        held = "" if self.bound_held is None else f"  {'held' if self.bound_held else 'BROKEN'}: {self.bound}"
        return (
            f"{self.name:<26} {self.sent:>5} {self.accepted:>5} {self.unavailable:>5} {other:>6} {self.lost:>5} "
            f"{self.doubled:>7} {rec:>9}   {self.pending:>7} {self.late:>5} {self.first_said_duplicate:>8} "
            f"{self.stored_unacked:>8} {self.crashes:>7} {self.stranded:>8}{held}"
        )

    @staticmethod
    def header() -> str:
        return (
            f"{'fault':<26} {'sent':>5} {'202':>5} {'503':>5} {'other':>6} {'lost':>5} {'doubled':>7} "
            f"{'recover s':>9}   {'pending':>7} {'>10s':>5} {'dup-1st':>8} {'unacked+':>8} {'crashes':>7} "
            f"{'stranded':>8}  bound"
        )

    def details(self) -> str:
        parts = (
            [f"bound {'held' if self.bound_held else 'BROKEN'}: {self.bound}"] if self.bound_held is not None else []
        )
        if self.other:
            parts.append("other: " + ", ".join(f"{k} ×{v}" for k, v in sorted(self.other.items())))
        created = Counter(self.created_answers.values())
        if created:
            parts.append("created answers per id: " + ", ".join(f"{k}→{v} ids" for k, v in sorted(created.items())))
        parts.append(f"events {self.events}, todos {self.todos}")
        if self.inbox_left is not None:
            parts.append(f"inbox left {self.inbox_left}")
        if self.unavailable_outside_fault:
            parts.append(
                f"503 outside the fault window: {self.unavailable_outside_fault}"
                f" (the last to a request begun {self.last_unavailable_after or 0:.1f} s after the fault ended)"
            )
        if self.rings is not None:
            parts.append(f"rings {self.rings} (rung twice: {self.ring_dups})")
        parts.extend(self.notes)
        return "; ".join(parts)


def _events_by_delivery(stack: FaultStack, hook: Hook) -> dict[str, tuple[int, float, int]]:
    """delivery id → (events, first created_at epoch, todos) for the hook, straight from the tables."""
    rows = stack.sql(
        "SELECT e.external_id, count(DISTINCT e.id), min(extract(epoch FROM e.created_at))::float8, count(t.id)"
        " FROM events e LEFT JOIN todos t ON t.event_id = e.id"
        " WHERE e.webhook_id = %s GROUP BY e.external_id",
        hook.webhook_id,
    )
    prefix = f"{hook.webhook_id}:"
    return {str(r[0]).removeprefix(prefix): (int(r[1]), float(r[2]), int(r[3])) for r in rows}


async def tally(
    stack: FaultStack,
    hook: Hook,
    name: str,
    answers: list[Answer],
    *,
    faults: list[tuple[float, float]] | None = None,
    within: float = 240.0,
) -> Outcome:
    """Wait until every accepted delivery has its event (or timeout) and the inbox drained, then count."""
    faults = faults or []
    out = Outcome(name)
    accepted = {a.delivery for a in answers if a.status == 202}
    inbox = await asyncio.to_thread(stack.has_inbox)
    deadline = time.monotonic() + within
    seen: dict[str, tuple[int, float, int]] = {}
    while True:
        try:
            seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
            depth = await asyncio.to_thread(stack.inbox_depth, hook.webhook_id)
        except psycopg.Error:  # PostgreSQL not back yet
            seen, depth = {}, 1
        if (accepted <= seen.keys() and depth == 0) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    # Settle: anything still on its way (a relayed start, a retried commit) lands before we count doubles.
    await asyncio.sleep(2.0)
    seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
    if inbox:
        out.inbox_left = await asyncio.to_thread(stack.inbox_depth, hook.webhook_id)
    orphans = await asyncio.to_thread(
        stack.count,
        "SELECT count(*) FROM todos t WHERE t.endpoint_id = %s AND NOT EXISTS"
        " (SELECT 1 FROM events e WHERE e.id = t.event_id)",
        hook.endpoint_id,
    )
    out.todos = await asyncio.to_thread(
        stack.count, "SELECT count(*) FROM todos WHERE endpoint_id = %s", hook.endpoint_id
    )
    out.events = sum(v[0] for v in seen.values())

    times_sent = Counter(a.delivery for a in answers)
    out.sent = len(answers)
    for a in answers:
        if a.status == 202:
            out.accepted += 1
            out.pending += a.pending
            if a.pending:
                out.pending_ids.add(a.delivery)
            if a.created:
                out.created_answers[a.delivery] = out.created_answers.get(a.delivery, 0) + 1
            else:
                out.created_answers.setdefault(a.delivery, 0)
            if a.duplicate and times_sent[a.delivery] == 1:
                out.first_said_duplicate += 1
        elif a.status == 503:
            out.unavailable += 1
            end = a.started + a.took
            if not any(a.started <= stop and end >= start for start, stop in faults):
                out.unavailable_outside_fault += 1
                after = a.started - max((stop for _, stop in faults), default=a.started)
                out.last_unavailable_after = max(out.last_unavailable_after or 0.0, after)
        elif a.status is None:
            out.other[f"no answer ({a.error})"] += 1
        else:
            out.other[str(a.status)] += 1
        if a.took > LATE_SECONDS:
            out.late += 1
    out.lost = len(accepted - seen.keys())
    out.doubled = sum(1 for n, _, todos in seen.values() if n > 1 or todos > 1) + orphans
    told_failed = {a.delivery for a in answers if a.status != 202} - accepted
    out.stored_unacked = len(told_failed & seen.keys())
    if faults:
        fault_end = max(stop for _, stop in faults)
        before = [seen[d][1] for d in accepted if d in seen and _first(answers, d) <= fault_end]
        out.recovery = max(0.0, max(before, default=fault_end) - fault_end)
    out.crashes = len(stack.crashes)
    if out.lost:
        missing = sorted(accepted - seen.keys())[:5]
        out.notes.append(f"lost ids (first 5): {', '.join(missing)}")
    return out


def _first(answers: list[Answer], delivery: str) -> float:
    return min(a.started for a in answers if a.delivery == delivery)
