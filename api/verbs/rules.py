"""Rule verbs of the webhooks family: manage a webhook's rules, dry-run them, backtest them over history.

Mutations compile their rules in the rule sandbox, then read-modify-validate-write under the webhook's row
lock (store.rules); the dry-run and the backtest route with the receiver's own pieces (build_envelope, the
sandbox, decide) and persist nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.verbs.registry import READ, Context, Hints, VerbInput, verb
from api.verbs.rule_schema import ActionJSON, RuleJSON, RulePatchJSON, RulesJSON
from routing.collectors import collector_config, delivery_kind
from routing.decision import decide
from routing.envelope import build_envelope, parse_payload
from routing.headers import lower_headers, sanitize_headers
from routing.models import TRUST_BY_SOURCE, Decision, Evaluation, Grant, OnFault
from routing.rules import RuleValidationError, validate_config
from routing.sandbox import SandboxPool
from store.errors import InvalidArgument, RuleNotFound
from store.rules import (
    Candidate,
    RuleConfig,
    StoredEvent,
    StoredTodo,
    compiled_in_sandbox,
    rejection,
    validate_on_fault,
)

FAMILY = "webhooks"
BACKTEST_MAX = 200
BACKTEST_DEFAULT = 50
_BACKTEST_BATCH = 20  # events (with payloads) held in memory at once


_RULES_DOC = "ordered rules {id?, name?, expr, action}; ids are minted when omitted"
_DEFAULT_DOC = 'the action when no rule matches; null means {"queue": <target queue>} on every target'
_PARAMS_DOC = "JSON object bound as $params in every expression (≤ 16 KiB encoded)"
_ON_FAULT_DOC = (
    '"continue" (a faulted rule is a no-match) or "hold" (any fault stops evaluation; the event is stored as'
    " faulted and nothing is minted)"
)


# ---------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------


class WebhookInput(VerbInput):
    webhook_id: str = Field(min_length=1, max_length=128, description="one of your webhooks (list_webhooks)")


class GrantTargetOut(BaseModel):
    """One live delivery target, in target order, with the scope queues exclusive delivery reads."""

    endpoint_id: str
    scope_queues: list[str]
    owner: bool = Field(description="the webhook's owning endpoint (always first when live)")


class GrantOut(BaseModel):
    """What a rule may reach right now, computed from switchboard state."""

    queues: list[str]
    endpoints: list[GrantTargetOut]


class RulesOutput(BaseModel):
    """A webhook's full routing configuration and the grant it is checked against."""

    webhook_id: str
    rules: RulesJSON
    default_action: ActionJSON | None = Field(description=_DEFAULT_DOC)
    effective_default_action: ActionJSON = Field(description="the default that applies today")
    params: dict[str, Any] | None
    on_fault: OnFault = Field(description=_ON_FAULT_DOC)
    grant: GrantOut


class SetRulesInput(WebhookInput):
    rules: RulesJSON = Field(description=_RULES_DOC)
    default_action: ActionJSON | None = Field(default=None, description=_DEFAULT_DOC)
    params: dict[str, Any] | None = Field(default=None, description=_PARAMS_DOC + "; omitting it clears them")
    on_fault: OnFault | None = Field(
        default=None, description=_ON_FAULT_DOC + "; omitted: the saved value stays (a careless save never loosens it)"
    )


class AddRuleInput(WebhookInput):
    rule: RuleJSON = Field(description="the rule to insert: {id?, name?, expr, action}")
    position: int | None = Field(default=None, ge=0, description="index to insert at; default: the end")


class AddRuleOutput(RulesOutput):
    rule_id: str = Field(description="the added rule's id (minted when omitted)")


class UpdateRuleInput(WebhookInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to change")
    rule: RulePatchJSON = Field(
        description="fields to replace (id, name, expr, action); a null name removes it; a new id renames"
    )


class MoveRuleInput(WebhookInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to move")
    position: int = Field(ge=0, description="the rule's index after the move")


class RemoveRuleInput(WebhookInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to remove")


class RemoveRuleOutput(RulesOutput):
    removed: bool = Field(description="false when no rule had that id (still a success)")


class CandidateInput(WebhookInput):
    """Candidate configuration; each omitted field falls back to the saved one. Never saved."""

    rules: RulesJSON | None = Field(default=None, description=_RULES_DOC + "; omitted: the saved rules")
    default_action: ActionJSON | None = Field(default=None, description=_DEFAULT_DOC + "; omitted: the saved default")
    params: dict[str, Any] | None = Field(default=None, description=_PARAMS_DOC + "; omitted: the saved params")
    on_fault: OnFault | None = Field(default=None, description=_ON_FAULT_DOC + "; omitted: the saved value")


class DryRunInput(CandidateInput):
    payload: Any = Field(default=None, description="a sample body (any JSON value), treated as verified")
    headers: dict[str, str] | None = Field(default=None, description="the sample's request headers")
    event_id: str | None = Field(default=None, min_length=1, max_length=128, description="an event of this webhook")
    omit_envelope: bool = Field(default=False, description="leave the evaluated envelope out of the answer")


class DecisionOut(BaseModel):
    """Where the delivery would go. For an exclusive action, endpoints is the single chosen one."""

    disposition: Literal["routed", "dropped", "faulted", "no_targets"]
    drop: bool
    queue: str | None
    endpoints: list[str]
    once_key: str | None = Field(default=None, description="the key a once action would claim at delivery")
    work_order: dict[str, Any] | None = None


class DryRunOutput(BaseModel):
    webhook_id: str
    event_id: str | None
    candidate: bool = Field(description="true when candidate rules, default or params were tried")
    decision: DecisionOut
    trace: dict[str, Any]
    envelope: dict[str, Any] | None


class BacktestInput(CandidateInput):
    limit: int = Field(default=BACKTEST_DEFAULT, ge=1, le=BACKTEST_MAX, description="most recent events to replay")


class OutcomeOut(BaseModel):
    """One routing outcome: what was stored, or what the candidate rules decide."""

    disposition: str = Field(
        description="routed | dropped | repeat (once key already claimed) | faulted (on_fault hold) | no_targets"
    )
    stage: str | None = None
    rule_index: int | None = None
    rule_id: str | None = None
    cause: str | None = None
    queue: str | None = None
    endpoints: list[str] = Field(default_factory=list)
    once_key: str | None = None
    faults: list[dict[str, Any]] = Field(default_factory=list)
    todos_missing: bool = Field(default=False, description="stored only: some todos were pruned by retention")


class BacktestEventOut(BaseModel):
    event_id: str
    received_at: datetime
    kind: str | None
    stored: OutcomeOut
    candidate: OutcomeOut
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


class BacktestOutput(BaseModel):
    webhook_id: str
    candidate: bool
    events: list[BacktestEventOut] = Field(description="newest first")
    summary: BacktestSummary


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _out(config: RuleConfig) -> dict[str, Any]:
    grant = config.grant
    return {
        "webhook_id": config.webhook_id,
        "rules": config.rules,
        "default_action": config.default_action,
        "effective_default_action": config.default_action or {"queue": grant.target_queue},
        "params": config.params,
        "on_fault": config.on_fault,
        "grant": GrantOut(
            queues=grant.queues(),
            endpoints=[
                GrantTargetOut(
                    endpoint_id=t.endpoint_id,
                    scope_queues=t.scope_queues,
                    owner=t.endpoint_id == grant.owner_endpoint_id,
                )
                for t in grant.targets
            ],
        ),
    }


def _index_of(rules: RulesJSON, rule_id: str) -> int | None:
    return next((i for i, r in enumerate(rules) if r.get("id") == rule_id), None)


def sandbox_of(ctx: Context) -> SandboxPool:
    """The rule verbs' own sandbox pool (built by the app lifespan): dry-runs, backtests and save-time compiles."""
    pool = ctx.services.rule_sandbox
    if pool is None:
        raise RuntimeError("the rule verbs' sandbox is not running (app lifespan not entered)")
    return pool


async def route(ctx: Context, grant: Grant, envelope: dict[str, Any]) -> Decision:
    """The receiver's router: evaluate in the sandbox only when there are rules, then decide."""
    evaluation = Evaluation()
    if grant.rules:
        evaluation = await sandbox_of(ctx).evaluate(grant.rules, grant.params, envelope)
    return decide(grant, evaluation, envelope)


async def candidate_grant(ctx: Context, saved: RuleConfig, data: CandidateInput) -> tuple[Grant, bool]:
    """The grant with candidate rules/default/params, validated exactly as a save (compiled in the sandbox)."""
    given = data.model_fields_set & {"rules", "default_action", "params", "on_fault"}
    if data.rules is None:
        given.discard("rules")
    if data.on_fault is None:
        given.discard("on_fault")
    if not given:
        return saved.grant, False
    rules = data.rules if "rules" in given else saved.rules
    default_action = data.default_action if "default_action" in given else saved.default_action
    params = data.params if "params" in given else saved.params
    compiled = await compiled_in_sandbox(rules, sandbox_of(ctx))
    try:
        norm_rules, norm_default, norm_params = validate_config(
            rules, default_action, params, saved.grant, compiled=compiled
        )
    except RuleValidationError as exc:
        raise rejection(exc) from exc
    update = {
        "rules": norm_rules,
        "default_action": norm_default,
        "params": norm_params if params is not None else None,
        "on_fault": validate_on_fault(data.on_fault if "on_fault" in given else saved.on_fault),
    }
    return saved.grant.model_copy(update=update), True


def event_envelope(event: StoredEvent) -> dict[str, Any]:
    """Rebuild a stored delivery's envelope exactly as the receiver built it."""
    return build_envelope(
        source=event.source,
        webhook_id=event.webhook_id,
        trust_mode=event.trust_mode,
        verified=event.verified,
        content_type=event.content_type,
        headers=event.headers,
        body=event.payload,
        # The receiver's own kind (a collector's kind rule may have set it), as RouteDelivery passes it.
        kind=event.kind,
    )


def sample_envelope(
    grant: Grant, config: dict[str, Any], payload: Any, headers: dict[str, str] | None
) -> dict[str, Any]:
    """A sample delivery treated as having passed the webhook's verification, kind derived as the receiver does."""
    raw = list((headers or {}).items())
    if not any(name.lower() == "content-type" for name, _ in raw):
        raw.append(("content-type", "application/json"))
    lowered = lower_headers(raw)
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    parsed = parse_payload(body)
    trust_mode = TRUST_BY_SOURCE.get(grant.source, "token")
    verified = trust_mode == "signed"
    kind = delivery_kind(grant.source, config, lowered, parsed)
    if grant.source == "generic":
        verified = collector_config(config).hmac is not None
    return build_envelope(
        source=grant.source,
        webhook_id=grant.webhook_id,
        trust_mode=trust_mode,
        verified=verified,
        content_type=lowered.get("content-type"),
        headers=sanitize_headers(raw),
        body=body,
        kind=kind,
    )


def decision_out(grant: Grant, decision: Decision) -> DecisionOut:
    if decision.disposition == "dropped":
        return DecisionOut(disposition="dropped", drop=True, queue=None, endpoints=[])
    if decision.disposition == "faulted":
        return DecisionOut(disposition="faulted", drop=False, queue=None, endpoints=[])
    if not decision.deliveries:
        return DecisionOut(disposition="no_targets", drop=False, queue=None, endpoints=[])
    return DecisionOut(
        disposition="routed",
        drop=False,
        queue=decision.deliveries[0].queue,
        endpoints=[d.endpoint_id for d in decision.deliveries],
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


def stored_outcome(event: StoredEvent, todos: dict[str, StoredTodo]) -> OutcomeOut:
    """What the receiver decided and minted for a stored event."""
    trace = event.routing_trace
    action = trace.get("action")
    queue = action.get("queue") if isinstance(action, dict) and event.disposition == "routed" else None
    found = [todos[t] for t in event.todo_ids if t in todos]
    if found:
        queue = found[0].queue
    return OutcomeOut(
        disposition=event.disposition,
        queue=queue if isinstance(queue, str) else None,
        endpoints=[t.endpoint_id for t in found],
        todos_missing=len(found) < len(event.todo_ids),
        **_trace_fields(trace),
    )


def candidate_outcome(grant: Grant, decision: Decision, repeat: bool) -> OutcomeOut:
    """What the candidate configuration decides; a once key claimed earlier makes it a repeat."""
    shown = decision_out(grant, decision)
    disposition: str = "repeat" if repeat and shown.disposition == "routed" else shown.disposition
    return OutcomeOut(
        disposition=disposition,
        queue=shown.queue,
        endpoints=[] if disposition == "repeat" else shown.endpoints,
        **_trace_fields(decision.trace),
    )


def _deliveries(outcome: OutcomeOut) -> tuple[str, list[tuple[str, str]]]:
    return outcome.disposition, sorted((e, outcome.queue or "") for e in outcome.endpoints)


def _changed(stored: OutcomeOut, candidate: OutcomeOut) -> bool:
    if stored.todos_missing:
        # Pruned todos leave the stored endpoints unknown: compare what is still on record.
        return (stored.disposition, stored.queue) != (candidate.disposition, candidate.queue)
    return _deliveries(stored) != _deliveries(candidate)


def _decider(outcome: OutcomeOut) -> str:
    if outcome.stage == "rule" and outcome.rule_id:
        return outcome.rule_id
    if outcome.rule_id:
        return f"default:{outcome.cause}:{outcome.rule_id}"
    return f"default:{outcome.cause}"


# ---------------------------------------------------------------------------------------------------
# Verbs
# ---------------------------------------------------------------------------------------------------


@verb(
    "list_webhook_rules",
    input=WebhookInput,
    output=RulesOutput,
    family=FAMILY,
    summary="A webhook's rules, default action, params and current grant.",
    hints=READ,
)
async def list_webhook_rules(ctx: Context, data: WebhookInput) -> RulesOutput:
    return RulesOutput(**_out(await ctx.services.rules.read(ctx.caller, data.webhook_id)))


@verb(
    "set_webhook_rules",
    input=SetRulesInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Replace a webhook's rules, default action and params together (omitted params are cleared).",
    rate_class="authoring",
    hints=Hints(destructive=True),
)
async def set_webhook_rules(ctx: Context, data: SetRulesInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        on_fault = data.on_fault if data.on_fault is not None else current.on_fault
        return Candidate(rules=data.rules, default_action=data.default_action, params=data.params, on_fault=on_fault)

    return RulesOutput(**_out(await ctx.services.rules.modify(ctx.caller, data.webhook_id, edit, sandbox_of(ctx))))


@verb(
    "add_webhook_rule",
    input=AddRuleInput,
    output=AddRuleOutput,
    family=FAMILY,
    summary="Insert one rule (at position, default the end); the id is minted when omitted.",
    rate_class="authoring",
)
async def add_webhook_rule(ctx: Context, data: AddRuleInput) -> AddRuleOutput:
    placed: list[int] = []

    def edit(current: RuleConfig) -> Candidate:
        rules: list[Any] = list(current.rules)
        position = len(rules) if data.position is None else data.position
        if position > len(rules):
            raise InvalidArgument(f"position {position} is past the end of the list ({len(rules)} rules)")
        rules.insert(position, data.rule)
        placed.append(position)
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    config = await ctx.services.rules.modify(ctx.caller, data.webhook_id, edit, sandbox_of(ctx))
    return AddRuleOutput(**_out(config), rule_id=config.rules[placed[-1]]["id"])


@verb(
    "update_webhook_rule",
    input=UpdateRuleInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Change fields of one rule by id; the list is re-validated in full.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def update_webhook_rule(ctx: Context, data: UpdateRuleInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        index = _index_of(current.rules, data.rule_id)
        if index is None:
            raise RuleNotFound(f"no rule with id {json.dumps(data.rule_id)}")
        merged: dict[str, Any] = {**current.rules[index], **data.rule}
        if merged.get("id") is None:
            merged["id"] = data.rule_id
        if merged.get("name", ...) is None:
            del merged["name"]
        rules: list[Any] = list(current.rules)
        rules[index] = merged
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    return RulesOutput(**_out(await ctx.services.rules.modify(ctx.caller, data.webhook_id, edit, sandbox_of(ctx))))


@verb(
    "move_webhook_rule",
    input=MoveRuleInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Move one rule to a new index (first match wins, so order is meaning).",
    rate_class="authoring",
    hints=Hints(idempotent=True),
)
async def move_webhook_rule(ctx: Context, data: MoveRuleInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        index = _index_of(current.rules, data.rule_id)
        if index is None:
            raise RuleNotFound(f"no rule with id {json.dumps(data.rule_id)}")
        if data.position >= len(current.rules):
            raise InvalidArgument(f"position {data.position} is out of range ({len(current.rules)} rules)")
        rules: list[Any] = list(current.rules)
        rules.insert(data.position, rules.pop(index))
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    return RulesOutput(**_out(await ctx.services.rules.modify(ctx.caller, data.webhook_id, edit, sandbox_of(ctx))))


@verb(
    "remove_webhook_rule",
    input=RemoveRuleInput,
    output=RemoveRuleOutput,
    family=FAMILY,
    summary="Remove one rule by id; removing an absent rule succeeds.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def remove_webhook_rule(ctx: Context, data: RemoveRuleInput) -> RemoveRuleOutput:
    store = ctx.services.rules
    current = await store.read(ctx.caller, data.webhook_id)
    if _index_of(current.rules, data.rule_id) is None:
        return RemoveRuleOutput(**_out(current), removed=False)
    removed: list[bool] = []

    def edit(locked: RuleConfig) -> Candidate:
        # Re-checked under the lock: a concurrent remove may have won.
        rules = [r for r in locked.rules if r.get("id") != data.rule_id]
        removed.append(len(rules) != len(locked.rules))
        return Candidate(
            rules=rules, default_action=locked.default_action, params=locked.params, on_fault=locked.on_fault
        )

    config = await store.modify(ctx.caller, data.webhook_id, edit, sandbox_of(ctx))
    return RemoveRuleOutput(**_out(config), removed=removed[-1])


@verb(
    "test_webhook_rules",
    input=DryRunInput,
    output=DryRunOutput,
    family=FAMILY,
    summary="Dry-run saved or candidate rules on a sample payload or a stored event; nothing is saved.",
    rate_class="authoring",
    hints=READ,
)
async def test_webhook_rules(ctx: Context, data: DryRunInput) -> DryRunOutput:
    has_payload = "payload" in data.model_fields_set
    has_event = data.event_id is not None
    if has_payload == has_event:
        raise InvalidArgument("give exactly one of payload (with optional headers) or event_id")
    if data.headers is not None and not has_payload:
        raise InvalidArgument("headers go with a sample payload; a stored event has its own")
    saved = await ctx.services.rules.read(ctx.caller, data.webhook_id)
    grant, is_candidate = await candidate_grant(ctx, saved, data)
    if data.event_id is not None:
        envelope = event_envelope(await ctx.services.rules.event(data.webhook_id, data.event_id))
    else:
        config = await ctx.services.rules.webhook_config(data.webhook_id)
        envelope = sample_envelope(grant, config, data.payload, data.headers)
    decision = await route(ctx, grant, envelope)
    return DryRunOutput(
        webhook_id=data.webhook_id,
        event_id=data.event_id,
        candidate=is_candidate,
        decision=decision_out(grant, decision),
        trace=decision.trace,
        envelope=None if data.omit_envelope else envelope,
    )


@verb(
    "backtest_webhook_rules",
    input=BacktestInput,
    output=BacktestOutput,
    family=FAMILY,
    summary="Replay saved or candidate rules over the webhook's recent events; report what would change.",
    rate_class="authoring",
    hints=READ,
)
async def backtest_webhook_rules(ctx: Context, data: BacktestInput) -> BacktestOutput:
    store = ctx.services.rules
    saved = await store.read(ctx.caller, data.webhook_id)
    grant, is_candidate = await candidate_grant(ctx, saved, data)
    # A caller's concurrent backtests run one after another, so one caller cannot fill the verbs' sandbox.
    async with ctx.services.backtests.hold(ctx.caller.endpoint_id):
        return await _backtest(ctx, data, grant, is_candidate)


async def _backtest(ctx: Context, data: BacktestInput, grant: Grant, is_candidate: bool) -> BacktestOutput:
    store = ctx.services.rules
    ids = await store.recent_event_ids(data.webhook_id, data.limit)
    window = set(ids)
    # Replay oldest first, so a once key claimed by an earlier replayed event makes later ones repeats.
    replay: list[tuple[StoredEvent, OutcomeOut, Decision]] = []
    oldest_first = ids[::-1]
    for start in range(0, len(oldest_first), _BACKTEST_BATCH):
        events = await store.events(data.webhook_id, oldest_first[start : start + _BACKTEST_BATCH])
        todos = await store.todos([t for e in events for t in e.todo_ids])
        for event in events:
            decision = await route(ctx, grant, event_envelope(event))
            replay.append((event, stored_outcome(event, todos), decision))
            # The payload is not needed past this point; keep memory flat across 200 large events.
            event.payload = b""
    keys = sorted({d.once_key for _, _, d in replay if d.once_key})
    # Claims made by events inside the window are replayed; older claims stand.
    claimed = {k for k, ev in (await store.once_claims(data.webhook_id, keys)).items() if ev not in window}

    rows: list[BacktestEventOut] = []
    for event, stored, decision in replay:
        repeat = decision.once_key is not None and decision.once_key in claimed
        candidate = candidate_outcome(grant, decision, repeat)
        if decision.once_key and candidate.disposition == "routed":
            claimed.add(decision.once_key)
        rows.append(
            BacktestEventOut(
                event_id=event.id,
                received_at=event.received_at,
                kind=event.kind,
                stored=stored,
                candidate=candidate,
                changed=_changed(stored, candidate),
                rule_changed=_decider(stored) != _decider(candidate),
            )
        )
    rows.reverse()
    summary = BacktestSummary(
        events=len(rows),
        changed=sum(r.changed for r in rows),
        rule_changed=sum(r.rule_changed for r in rows),
        faulted=sum(bool(r.candidate.faults) for r in rows),
        by_decision=dict(Counter(r.candidate.disposition for r in rows)),
        stored_by_decision=dict(Counter(r.stored.disposition for r in rows)),
        by_rule=dict(Counter(_decider(r.candidate) for r in rows)),
        transitions=dict(Counter(f"{r.stored.disposition}→{r.candidate.disposition}" for r in rows if r.changed)),
    )
    return BacktestOutput(webhook_id=data.webhook_id, candidate=is_candidate, events=rows, summary=summary)
