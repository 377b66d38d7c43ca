"""Deliveries routed again without writing anything: the dry-run, the backtest, and the check of a rule save.

Not Temporal's replay of a workflow history (that is tests/workflows/replay.py). The pure parts: the
configuration to try, the envelope of a sample or stored delivery, what a stored event's outcome was and what the candidate configuration decides, whether they differ, which rule
(or default cause) decided, and the once-key simulation across a replayed window. Routing itself is
routing.router's; the reads are the store's (store.events), behind ``History``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from routing.collectors import collector_config, delivery_kind
from routing.delivery import envelope_of
from routing.envelope import build_envelope, parse_payload
from routing.headers import lower_headers, sanitize_headers
from routing.models import TRUST_BY_SOURCE, Decision, EventDisposition, Grant
from routing.router import Evaluate, evaluation_input, route
from routing.rules import Candidate, describe_rule
from routing.sources import find_source
from routing.trust import Release

# Events (with payloads) a backtest holds in memory at once.
REPLAY_BATCH = 20
CANDIDATE_FIELDS = ("rules", "default_action", "params", "on_fault")

OutcomeDisposition = Literal["routed", "dropped", "repeat", "faulted", "quarantined", "no_targets"]


class StoredEvent(BaseModel):
    """An event as the receiver stored it: enough to rebuild its routing envelope and read its outcome."""

    id: str
    webhook_id: str
    source: str
    kind: str | None
    trust_mode: str
    verified: bool
    content_type: str | None
    headers: dict[str, str]
    payload: bytes
    payload_size: int
    received_at: datetime
    routing_trace: dict[str, Any]
    disposition: EventDisposition
    todo_ids: list[str]
    # The release that routed this event past the trust gate, when it is a release (or a released re-route).
    release: Release | None = None

    @property
    def body(self) -> bytes:
        """The stored body, exactly as received."""
        return self.payload

    def envelope(self, trusted_actors: Any = None) -> dict[str, Any]:
        """The envelope the receiver built for this delivery under the webhook's gate (routing.delivery.envelope_of)."""
        return envelope_of(self, trusted_actors)


class StoredTodo(BaseModel):
    """Where a stored delivery landed: one todo's endpoint and queue."""

    id: str
    endpoint_id: str
    queue: str


class History(Protocol):
    """The reads a backtest makes of a webhook's history (store.events.EventStore)."""

    async def recent_event_ids(self, webhook_id: str, limit: int) -> list[str]:
        """Ids of the webhook's most recent events, newest first."""
        ...

    async def stored_events(self, webhook_id: str, event_ids: Sequence[str]) -> list[StoredEvent]:
        """The named events of this webhook, payloads included, in the order asked."""
        ...

    async def landed_todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        """Endpoint and queue of the named todos that still exist."""
        ...

    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        """once_key → claiming event id, for the keys of this webhook already claimed."""
        ...


# ---------------------------------------------------------------------------------------------------
# What is replayed: the configuration and the envelope
# ---------------------------------------------------------------------------------------------------


def candidate_of(saved: Grant, given: Mapping[str, Any]) -> Candidate | None:
    """The configuration to try: each given field over the saved one; None when nothing is given.

    ``given`` holds only the fields the caller set. A null ``rules`` or ``on_fault`` means the saved one; a
    null ``default_action`` or ``params`` is itself a value (no default, no params).
    """
    fields = {
        k: v for k, v in given.items() if k in CANDIDATE_FIELDS and not (v is None and k in ("rules", "on_fault"))
    }
    if not fields:
        return None
    return Candidate(
        rules=fields.get("rules", saved.rules),
        default_action=fields.get("default_action", saved.default_action),
        params=fields.get("params", saved.params),
        on_fault=fields.get("on_fault", saved.on_fault),
    )


def sample_envelope(
    grant: Grant,
    config: dict[str, Any],
    payload: Any,
    headers: dict[str, str] | None,
    *,
    release: Release | None = None,
) -> dict[str, Any]:
    """A sample delivery treated as having passed the webhook's verification, kind derived as the receiver does
    (and, with ``release``, as a person's release of it)."""
    raw = list((headers or {}).items())
    if not any(name.lower() == "content-type" for name, _ in raw):
        raw.append(("content-type", "application/json"))
    lowered = lower_headers(raw)
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    parsed = parse_payload(body)
    trust_mode = TRUST_BY_SOURCE.get(grant.source, "token")
    row = find_source(grant.source)
    # Verified as the receiver would find it: a signed source's scheme, or a collector's configured HMAC.
    verified = row is not None and row.verifies(
        collector_hmac=row.collector and collector_config(config).hmac is not None
    )
    kind = delivery_kind(grant.source, config, lowered, parsed)
    return build_envelope(
        source=grant.source,
        webhook_id=grant.webhook_id,
        trust_mode=trust_mode,
        verified=verified,
        content_type=lowered.get("content-type"),
        headers=sanitize_headers(raw),
        body=body,
        kind=kind,
        trusted_actors=grant.trusted_actors,
        release=release.envelope() if release is not None else None,
    )


# ---------------------------------------------------------------------------------------------------
# Outcomes: what was stored, what the candidate decides, and how they compare
# ---------------------------------------------------------------------------------------------------


class DecisionSummary(BaseModel):
    """Where the delivery would go. For an exclusive action, endpoints is the single chosen one."""

    disposition: Literal["routed", "dropped", "faulted", "quarantined", "no_targets"]
    drop: bool
    queue: str | None
    endpoints: list[str]
    once_key: str | None = Field(default=None, description="the key a once action would claim at delivery")
    work_order: dict[str, Any] | None = None


class Outcome(BaseModel):
    """One routing outcome: what was stored, or what the candidate rules decide."""

    disposition: OutcomeDisposition = Field(
        description=(
            "routed | dropped | repeat (once key already claimed) | faulted (on_fault hold) | quarantined (held for"
            " a person: the trust gate or a quarantine action) | no_targets"
        )
    )
    # Read back from stored traces, which later stages (triage) may extend: kept as the strings they are.
    stage: str | None = None
    rule_index: int | None = None
    rule_id: str | None = None
    cause: str | None = None
    queue: str | None = None
    endpoints: list[str] = Field(default_factory=list)
    once_key: str | None = None
    faults: list[dict[str, Any]] = Field(default_factory=list)
    todos_missing: bool = Field(default=False, description="stored only: some todos were pruned by retention")


def summarize_decision(decision: Decision) -> DecisionSummary:
    """The decision as the dry-run answers it."""
    if decision.disposition == "dropped":
        return DecisionSummary(disposition="dropped", drop=True, queue=None, endpoints=[])
    if decision.disposition == "faulted":
        return DecisionSummary(disposition="faulted", drop=False, queue=None, endpoints=[])
    if decision.disposition == "quarantined":
        return DecisionSummary(disposition="quarantined", drop=False, queue=None, endpoints=[])
    if not decision.todos:
        return DecisionSummary(disposition="no_targets", drop=False, queue=None, endpoints=[])
    return DecisionSummary(
        disposition="routed",
        drop=False,
        queue=decision.todos[0].queue,
        endpoints=[t.endpoint_id for t in decision.todos],
        once_key=decision.once_key,
        work_order=decision.work_order,
    )


def _trace_fields(trace: dict[str, Any]) -> dict[str, Any]:
    faults = trace.get("faults")
    return {
        "stage": trace.get("stage"),
        "rule_index": trace.get("rule_index"),
        "rule_id": trace.get("rule_id"),
        "cause": trace.get("cause"),
        "once_key": trace.get("once_key"),
        "faults": faults if isinstance(faults, list) else [],
    }


def stored_outcome(event: StoredEvent, todos: Mapping[str, StoredTodo]) -> Outcome:
    """What the receiver decided and minted for a stored event."""
    trace = event.routing_trace
    action = trace.get("action")
    queue = action.get("queue") if isinstance(action, dict) and event.disposition == "routed" else None
    found = [todos[t] for t in event.todo_ids if t in todos]
    if found:
        queue = found[0].queue
    return Outcome(
        disposition=event.disposition,
        queue=queue if isinstance(queue, str) else None,
        endpoints=[t.endpoint_id for t in found],
        todos_missing=len(found) < len(event.todo_ids),
        **_trace_fields(trace),
    )


def candidate_outcome(decision: Decision, repeat: bool) -> Outcome:
    """What the candidate configuration decides; a once key claimed earlier makes it a repeat."""
    shown = summarize_decision(decision)
    disposition: OutcomeDisposition = "repeat" if repeat and shown.disposition == "routed" else shown.disposition
    return Outcome(
        disposition=disposition,
        queue=shown.queue,
        endpoints=[] if disposition == "repeat" else shown.endpoints,
        **_trace_fields(decision.trace),
    )


def _placements(outcome: Outcome) -> tuple[str, list[tuple[str, str]]]:
    return outcome.disposition, sorted((e, outcome.queue or "") for e in outcome.endpoints)


def changed(stored: Outcome, candidate: Outcome) -> bool:
    """Whether the disposition or the (endpoint, queue) todos differ."""
    if stored.todos_missing:
        # Pruned todos leave the stored endpoints unknown: compare what is still on record.
        return (stored.disposition, stored.queue) != (candidate.disposition, candidate.queue)
    return _placements(stored) != _placements(candidate)


def decider(outcome: Outcome) -> str:
    """What decided: the rule id, or "default:<cause>" (with the matched rule a default overrode)."""
    if outcome.stage == "rule" and outcome.rule_id:
        return outcome.rule_id
    if outcome.rule_id:
        return f"default:{outcome.cause}:{outcome.rule_id}"
    return f"default:{outcome.cause}"


# ---------------------------------------------------------------------------------------------------
# The backtest: a window of stored events routed again, once-keys simulated across it
# ---------------------------------------------------------------------------------------------------


@dataclass
class Replayed:
    """One stored event routed again: the event (payload released), its stored outcome, the new decision."""

    event: StoredEvent
    stored: Outcome
    decision: Decision


class ReplayedEvent(BaseModel):
    """One event of a backtest: its stored outcome beside the candidate's."""

    event_id: str
    received_at: datetime
    kind: str | None
    stored: Outcome
    candidate: Outcome
    changed: bool = Field(description="the disposition or the (endpoint, queue) deliveries differ")
    rule_changed: bool = Field(description="a different rule (or default cause) decided")


class BacktestSummary(BaseModel):
    events: int
    changed: int
    rule_changed: int
    faulted: int = Field(description="events whose candidate evaluation recorded a fault")
    by_decision: dict[str, int] = Field(description="candidate dispositions")
    stored_by_decision: dict[str, int]
    by_rule: dict[str, int] = Field(description='candidate hits per rule id, or "default:<cause>"')
    transitions: dict[str, int] = Field(description='"stored→candidate" dispositions of changed events')


@dataclass(frozen=True)
class Backtest:
    """A backtest's answer: the replayed events newest first, and their summary."""

    events: list[ReplayedEvent]
    summary: BacktestSummary


async def replay_events(history: History, grant: Grant, event_ids: Sequence[str], evaluate: Evaluate) -> list[Replayed]:
    """Route the named events (newest first) again under ``grant``, oldest first, a batch of payloads at a time."""
    out: list[Replayed] = []
    # Oldest first, so a once key claimed by an earlier replayed event makes later ones repeats (simulate_once).
    oldest_first = list(event_ids)[::-1]
    for start in range(0, len(oldest_first), REPLAY_BATCH):
        events = await history.stored_events(grant.webhook_id, oldest_first[start : start + REPLAY_BATCH])
        todos = await history.landed_todos([t for e in events for t in e.todo_ids])
        for event in events:
            routed = await route(grant, event.envelope(grant.trusted_actors), evaluate)
            out.append(Replayed(event=event, stored=stored_outcome(event, todos), decision=routed.decision))
            # The payload is not needed past this point; keep memory flat across 200 large events.
            event.payload = b""
    return out


def once_keys(replayed: Sequence[Replayed]) -> list[str]:
    """The once-keys the replayed decisions would claim, sorted."""
    return sorted({r.decision.once_key for r in replayed if r.decision.once_key})


def standing_claims(claims: Mapping[str, str], window: set[str]) -> set[str]:
    """The once-keys claimed before the window: claims made by events inside it are replayed instead."""
    return {key for key, event_id in claims.items() if event_id not in window}


def simulate_once(replayed: Sequence[Replayed], claimed: set[str]) -> list[ReplayedEvent]:
    """Stored beside candidate for each replayed event (oldest first); a key claimed earlier makes a repeat."""
    claimed = set(claimed)
    rows: list[ReplayedEvent] = []
    for item in replayed:
        key = item.decision.once_key
        candidate = candidate_outcome(item.decision, key is not None and key in claimed)
        if key and candidate.disposition == "routed":
            claimed.add(key)
        rows.append(
            ReplayedEvent(
                event_id=item.event.id,
                received_at=item.event.received_at,
                kind=item.event.kind,
                stored=item.stored,
                candidate=candidate,
                changed=changed(item.stored, candidate),
                rule_changed=decider(item.stored) != decider(candidate),
            )
        )
    return rows


def summarize(rows: Sequence[ReplayedEvent]) -> BacktestSummary:
    """Counts over a backtest's rows."""
    return BacktestSummary(
        events=len(rows),
        changed=sum(r.changed for r in rows),
        rule_changed=sum(r.rule_changed for r in rows),
        faulted=sum(bool(r.candidate.faults) for r in rows),
        by_decision=dict(Counter(r.candidate.disposition for r in rows)),
        stored_by_decision=dict(Counter(r.stored.disposition for r in rows)),
        by_rule=dict(Counter(decider(r.candidate) for r in rows)),
        transitions=dict(Counter(f"{r.stored.disposition}→{r.candidate.disposition}" for r in rows if r.changed)),
    )


async def backtest(history: History, grant: Grant, limit: int, evaluate: Evaluate) -> Backtest:
    """Replay ``grant`` over the webhook's ``limit`` most recent events; report what would change."""
    ids = await history.recent_event_ids(grant.webhook_id, limit)
    replayed = await replay_events(history, grant, ids, evaluate)
    claims = await history.once_claims(grant.webhook_id, once_keys(replayed))
    rows = simulate_once(replayed, standing_claims(claims, set(ids)))
    rows.reverse()
    return Backtest(events=rows, summary=summarize(rows))


# ---------------------------------------------------------------------------------------------------
# Saves that would fault on real traffic: the candidate rules over the webhook's latest stored events
# ---------------------------------------------------------------------------------------------------

# A save replays its rules over this many of the webhook's latest stored events (routing/rules.py's
# rule_faults_on_recent_events refuses it when a rule errors or times out on any of them).
RECENT_EVENTS = 50
# The rule's own faults that refuse a save; budget_exhausted (not reached) and sandbox-level faults are not a
# rule's doing.
SAVE_FAULT_CAUSES = ("error", "timeout")
NAMED_EVENTS = 5


class RecentFault(BaseModel):
    """A rule that errors or times out on some of the webhook's latest stored events."""

    rule_index: int
    rule_id: str | None = None
    rule_name: str | None = None
    causes: list[str] = Field(description="error and/or timeout")
    events: int = Field(description="how many of the replayed events it faulted on")
    event_ids: list[str] = Field(description=f"up to {NAMED_EVENTS} of them, newest first")


@dataclass
class RecentCheck:
    """What replaying a candidate list over the latest stored events found."""

    replayed: int = 0
    faults: list[RecentFault] = field(default_factory=list)
    # Events the sandbox could not evaluate at all (no slot in time): the check is incomplete.
    unchecked: int = 0


async def recent_faults(history: History, grant: Grant, evaluate: Evaluate, limit: int = RECENT_EVENTS) -> RecentCheck:
    """Evaluate ``grant``'s rules (first match wins, as a delivery would) on the webhook's latest stored events,
    newest first, until a rule has faulted on NAMED_EVENTS of them (a runaway rule costs a save a few evaluations,
    not fifty).

    Every event is evaluated, including those the trust gate would hold: a release routes them past the gate,
    so the rules meet them too. Nothing is decided or written.
    """
    check = RecentCheck()
    if not grant.rules:
        return check
    ids = await history.recent_event_ids(grant.webhook_id, limit)
    found: dict[int, RecentFault] = {}
    for start in range(0, len(ids), REPLAY_BATCH):
        for event in await history.stored_events(grant.webhook_id, ids[start : start + REPLAY_BATCH]):
            request = evaluation_input(grant, event.envelope(grant.trusted_actors))
            event.payload = b""
            if request is None:
                continue
            evaluation = await evaluate(request)
            check.replayed += 1
            if any(f.rule_index == -1 and f.cause == "sandbox_busy" for f in evaluation.faults):
                check.unchecked += 1
            seen: set[int] = set()
            for fault in evaluation.faults:
                if fault.cause not in SAVE_FAULT_CAUSES or not 0 <= fault.rule_index < len(grant.rules):
                    continue
                rule = grant.rules[fault.rule_index]
                entry = found.setdefault(
                    fault.rule_index,
                    RecentFault(
                        rule_index=fault.rule_index,
                        rule_id=rule.get("id"),
                        rule_name=rule.get("name"),
                        causes=[],
                        events=0,
                        event_ids=[],
                    ),
                )
                if fault.cause not in entry.causes:
                    entry.causes.append(fault.cause)
                if fault.rule_index not in seen:
                    seen.add(fault.rule_index)
                    entry.events += 1
                    entry.event_ids.append(event.id)
            if any(entry.events >= NAMED_EVENTS for entry in found.values()):
                return _found(check, found)
    return _found(check, found)


def _found(check: RecentCheck, found: dict[int, RecentFault]) -> RecentCheck:
    check.faults = [found[i] for i in sorted(found)]
    return check


def recent_faults_message(faults: Sequence[RecentFault], replayed: int) -> str:
    """The refusal naming the first faulting rule and up to five of its events (the others are counted)."""
    first = faults[0]
    where = describe_rule(first.rule_index, first.rule_id or None, first.rule_name or None)
    more = f"; {len(faults) - 1} more rule(s) fault too" if len(faults) > 1 else ""
    return (
        f"{where}: {' and '.join(first.causes)} on {first.events} of the webhook's latest {replayed} stored events"
        f" ({', '.join(first.event_ids)}){more}; nothing was saved (force: true saves anyway)"
    )
