"""The pure decision: apply the matched rule (or the default) to the grant and write the trace.

Deterministic and free of I/O, clocks and randomness, so a Temporal workflow may call it directly. ``decide``
runs these steps in order, each a function of its own:

1. **match** — which configured rule the evaluation chose (``match``);
2. **hold** — under on_fault "hold", a fault before the match stops here, minting nothing (``held``);
3. **action** — the matched rule's action re-applied to the live grant (``rule_choice``), else, when the
   webhook has an LLM triage stage and no rule matched, the model's answer judged by routing.triage
   (``llm_choice``), else the default (``default_choice``), see ``choose``;
4. **targets** — the action's queue on the targets it reaches: endpoint intersection, exclusive pick
   (``apply_action``);
5. **claims** — the once-key, the coalescing subject and the work order the routed todos carry (``settle``);
6. **trace** — what decided and why (``trace_of``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from routing.actions import QUARANTINE, parse_action
from routing.collectors import path_subject
from routing.envelope import once_key, subject_key
from routing.models import TRUST_BY_SOURCE, Cause, Decision, Evaluation, Fault, Grant, Mint, Stage
from routing.triage import TriageResult, judge, not_run_record
from routing.workorder import build_work_order

CAUSE_NO_MATCH: Cause = "no_match_default"
CAUSE_RULE_NOT_GRANTED: Cause = "rule_not_granted"
CAUSE_DEFAULT_NOT_GRANTED: Cause = "default_not_granted"
CAUSE_HELD_ON_FAULT: Cause = "held_on_fault"  # stage "fault": on_fault "hold" stopped evaluation at a fault


@dataclass
class Applied:
    """An action re-applied to the live grant: dropped, quarantined, or the todos it mints."""

    drop: bool = False
    quarantine: bool = False
    todos: list[Mint] = field(default_factory=list)


@dataclass(frozen=True)
class Match:
    """The configured rule the evaluation chose; ``index`` is None when none did."""

    index: int | None = None
    rule: Any = None
    rule_id: str | None = None
    rule_name: str | None = None


@dataclass(frozen=True)
class Choice:
    """The action that decides, the stage it came from, why (for a default), and what it reaches."""

    stage: Stage
    cause: Cause | None
    action: Mapping[str, Any]
    applied: Applied
    llm: dict[str, Any] | None = None  # the triage stage's record (provider, model, answer, threshold, outcome)


def default_todos(grant: Grant) -> list[Mint]:
    """The webhook's target queue on every live target, in target order."""
    return [Mint(endpoint_id=t.endpoint_id, queue=grant.target_queue) for t in grant.targets]


def apply_action(action: Any, grant: Grant) -> Applied | None:
    """Re-apply a stored action to this delivery's grant; None when it is malformed or not granted."""
    # Stored rows may have bypassed save-time validation: the shape is re-checked by the save's own parser.
    try:
        parsed = parse_action(action)
    except ValueError:
        return None
    if "drop" in parsed:
        return Applied(drop=True)
    if QUARANTINE in parsed:
        return Applied(quarantine=True)
    queue = parsed["queue"]
    if queue not in grant.queues():
        return None
    candidates = list(grant.targets)
    if "endpoints" in parsed:
        # Intersection in target order, never in the rule's order: the grant decides precedence.
        wanted = set(parsed["endpoints"])
        candidates = [t for t in candidates if t.endpoint_id in wanted]
    if parsed.get("exclusive") is True:
        scoped = [t for t in candidates if queue in t.scope_queues]
        candidates = scoped[:1]
    if not candidates:
        return None
    return Applied(todos=[Mint(endpoint_id=t.endpoint_id, queue=queue) for t in candidates])


def _rule_identity(rule: Any) -> tuple[str | None, str | None]:
    """A stored rule's id and name, when they are strings."""
    if not isinstance(rule, Mapping):
        return None, None
    rule_id = rule.get("id")
    rule_name = rule.get("name")
    return (
        rule_id if isinstance(rule_id, str) else None,
        rule_name if isinstance(rule_name, str) else None,
    )


def match(grant: Grant, evaluation: Evaluation) -> Match:
    """The rule the evaluation matched, read against the configured list."""
    index = evaluation.matched_index
    # The sandbox child only reports an index; one outside the configured list is ignored.
    if isinstance(index, bool) or index is None or not 0 <= index < len(grant.rules):
        return Match()
    rule = grant.rules[index]
    rule_id, rule_name = _rule_identity(rule)
    return Match(index=index, rule=rule, rule_id=rule_id, rule_name=rule_name)


def holding_fault(evaluation: Evaluation, matched_index: int | None) -> Fault | None:
    """Under on_fault "hold", the fault that stops evaluation: the first one before the match (or any, unmatched)."""
    for fault in evaluation.faults:
        # A sandbox-level fault (index -1) concerns the whole list; a fault after the match cannot decide.
        if matched_index is None or fault.rule_index < matched_index:
            return fault
    return None


def _faults(evaluation: Evaluation) -> list[dict[str, Any]]:
    return [f.model_dump(exclude_none=True) for f in evaluation.faults]


def held(evaluation: Evaluation, fault: Fault, rules: list[dict[str, Any]]) -> Decision:
    """The faulted decision: nothing minted, the stopping rule and every fault on the trace."""
    trace: dict[str, Any] = {"stage": "fault", "cause": CAUSE_HELD_ON_FAULT, "rule_index": fault.rule_index}
    if 0 <= fault.rule_index < len(rules):
        rule_id, rule_name = _rule_identity(rules[fault.rule_index])
        if rule_id is not None:
            trace["rule_id"] = rule_id
        if rule_name is not None:
            trace["rule_name"] = rule_name
    trace["faults"] = _faults(evaluation)
    return Decision(disposition="faulted", todos=[], trace=trace)


def rule_choice(grant: Grant, matched: Match) -> Choice | None:
    """The matched rule's action on this grant; None when no rule matched or its action is not reachable."""
    if matched.index is None:
        return None
    action: Any = matched.rule.get("action") if isinstance(matched.rule, Mapping) else None
    applied = apply_action(action, grant)  # None unless action is a mapping
    if applied is None:
        return None
    return Choice(stage="rule", cause=None, action=action, applied=applied)


def default_choice(
    grant: Grant, matched: Match, *, cause: Cause | None = None, llm: dict[str, Any] | None = None
) -> Choice:
    """The configured default on this grant, else the target queue on every target; the cause says why."""
    # A matched rule that is no longer reachable takes the default; it never falls through to a later rule.
    if cause is None:
        cause = CAUSE_NO_MATCH if matched.index is None else CAUSE_RULE_NOT_GRANTED
    if grant.default_action is not None:
        applied = apply_action(grant.default_action, grant)
        if applied is not None:
            return Choice(stage="default", cause=cause, action=grant.default_action, applied=applied, llm=llm)
        cause = CAUSE_DEFAULT_NOT_GRANTED
    return Choice(
        stage="default",
        cause=cause,
        action={"queue": grant.target_queue},
        applied=Applied(todos=default_todos(grant)),
        llm=llm,
    )


def triage_due(grant: Grant, evaluation: Evaluation) -> bool:
    """Whether the LLM triage stage runs: configured, no rule matched, and on_fault did not hold."""
    if grant.llm_triage is None:
        return False
    matched = match(grant, evaluation)
    if matched.index is not None:
        # A matched rule decides, even when it is no longer reachable (it takes the default, never a model).
        return False
    return not (grant.on_fault == "hold" and holding_fault(evaluation, None) is not None)


def llm_choice(grant: Grant, matched: Match, triage: TriageResult | None) -> Choice:
    """The triage stage's queue when its answer is granted and confident enough, else the default with its cause.

    ``triage`` is the triage activity's result; None means no model was called here (dry-run, backtest), which
    the trace records as llm outcome "not_run" before the default it would fall back to.
    """
    config = grant.llm_triage
    assert config is not None
    if triage is None:
        return default_choice(grant, matched, llm=not_run_record(config))
    verdict = judge(config, triage, grant.queues())
    if verdict.queue is not None:
        action = {"queue": verdict.queue}
        applied = apply_action(action, grant)
        if applied is not None:
            return Choice(stage="llm", cause=None, action=action, applied=applied, llm=verdict.record)
        record = {**verdict.record, "outcome": "llm_rejected", "detail": "the answer's queue reaches no live target"}
        return default_choice(grant, matched, cause="llm_rejected", llm=record)
    return default_choice(grant, matched, cause=verdict.cause, llm=verdict.record)


def choose(grant: Grant, matched: Match, triage: TriageResult | None = None) -> Choice:
    """The deciding action: the matched rule's when it is reachable, else triage's (when configured), else the
    default. Nothing before this point depends on a model; triage's answer is an activity result passed in."""
    ruled = rule_choice(grant, matched)
    if ruled is not None:
        return ruled
    if grant.llm_triage is not None and matched.index is None:
        return llm_choice(grant, matched, triage)
    return default_choice(grant, matched)


def trace_of(matched: Match, choice: Choice, evaluation: Evaluation) -> dict[str, Any]:
    """The routing trace: stage, cause, the matched rule, the applied action and every fault on the way."""
    trace: dict[str, Any] = {"stage": choice.stage}
    if choice.cause is not None:
        trace["cause"] = choice.cause
    if matched.index is not None:
        trace["rule_index"] = matched.index
        if matched.rule_id is not None:
            trace["rule_id"] = matched.rule_id
        if matched.rule_name is not None:
            trace["rule_name"] = matched.rule_name
    trace["action"] = copy.deepcopy(dict(choice.action))
    if choice.llm is not None:
        trace["llm"] = copy.deepcopy(choice.llm)
    if evaluation.faults:
        trace["faults"] = _faults(evaluation)
    return trace


def _work_order(
    grant: Grant,
    envelope: Mapping[str, Any] | None,
    *,
    lane: str,
    stage: str,
    rule_id: str | None,
    rule_name: str | None,
) -> dict[str, Any]:
    """Build the work order from switchboard state and the switchboard-built envelope."""
    env = envelope or {}
    trust_mode = env.get("trust_mode")
    if not isinstance(trust_mode, str):
        trust_mode = TRUST_BY_SOURCE.get(grant.source, "token")
    return build_work_order(
        lane=lane,
        # Source and webhook come from the grant: switchboard state, not anything a rule could shape.
        source=grant.source,
        webhook_id=grant.webhook_id,
        trust_mode=trust_mode,
        verified=env.get("verified") is True,
        stage=stage,
        rule_id=rule_id,
        rule_name=rule_name,
        envelope=envelope,
    )


def settle(
    grant: Grant, matched: Match, choice: Choice, trace: dict[str, Any], envelope: dict[str, Any] | None
) -> Decision:
    """The decision for a chosen action: dropped, quarantined, or its todos with the claims its flags ask for."""
    if choice.applied.drop:
        return Decision(disposition="dropped", todos=[], trace=trace)
    if choice.applied.quarantine:
        # Held for a person (release_webhook_event): no todo, no once-key, no ring.
        return Decision(disposition="quarantined", todos=[], trace=trace)
    action = choice.action
    todos = choice.applied.todos
    queue = todos[0].queue if todos else grant.target_queue
    key: str | None = None
    if action.get("once") is True:
        # No recognizable subject means no claim: the delivery routes as an ordinary one.
        key = once_key(subject_key(envelope), queue)
        if key is not None:
            trace["once_key"] = key
    coalesce_subject: str | None = None
    if action.get("coalesce") is True:
        # Issue and cairn keys first; other sources key on the webhook's configured subject_path.
        coalesce_subject = subject_key(envelope) or path_subject(envelope, grant.subject_path, grant.webhook_id)
        if coalesce_subject is not None:
            trace["subject_key"] = coalesce_subject
    work_order: dict[str, Any] | None = None
    if action.get("work_order") is True:
        by_rule = choice.stage == "rule"
        work_order = _work_order(
            grant,
            envelope,
            lane=queue,
            stage=choice.stage,
            # The work order names the rule that authorized it, so only a rule stage carries one.
            rule_id=matched.rule_id if by_rule else None,
            rule_name=matched.rule_name if by_rule else None,
        )
    return Decision(
        disposition="routed",
        todos=todos,
        trace=trace,
        once_key=key,
        work_order=work_order,
        coalesce=coalesce_subject is not None,
        subject_key=coalesce_subject,
    )


def decide(
    grant: Grant,
    evaluation: Evaluation,
    envelope: dict[str, Any] | None = None,
    triage: TriageResult | None = None,
) -> Decision:
    """Turn an evaluation (and, when it ran, the triage stage's result) into the todos to mint under the grant
    recomputed for this delivery."""
    matched = match(grant, evaluation)
    if grant.on_fault == "hold":
        fault = holding_fault(evaluation, matched.index)
        if fault is not None:
            return held(evaluation, fault, grant.rules)
    choice = choose(grant, matched, triage)
    return settle(grant, matched, choice, trace_of(matched, choice, evaluation), envelope)
