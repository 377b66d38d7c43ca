"""The pure decision: apply the matched rule (or the default) to the grant and write the trace.

Deterministic and free of I/O, clocks and randomness, so a Temporal workflow may call it directly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from routing.collectors import path_subject
from routing.envelope import once_key, subject_key
from routing.models import TRUST_BY_SOURCE, Decision, Delivery, Evaluation, Fault, Grant
from routing.workorder import build_work_order

# Kept here rather than imported from routing.rules, which loads the jq extension: a Temporal workflow
# imports this module inside its sandbox and must not need jq.
QUEUE_FLAGS = ("exclusive", "once", "work_order", "coalesce")

CAUSE_NO_MATCH = "no_match_default"
CAUSE_RULE_NOT_GRANTED = "rule_not_granted"
CAUSE_DEFAULT_NOT_GRANTED = "default_not_granted"
CAUSE_HELD_ON_FAULT = "held_on_fault"  # stage "fault": on_fault "hold" stopped evaluation at a fault


@dataclass
class _Applied:
    """An action re-applied to the live grant: dropped, or the deliveries it reaches."""

    drop: bool = False
    deliveries: list[Delivery] = field(default_factory=list)


def default_deliveries(grant: Grant) -> list[Delivery]:
    """The webhook's target queue on every live target, in target order."""
    return [Delivery(endpoint_id=t.endpoint_id, queue=grant.target_queue) for t in grant.targets]


def apply_action(action: Any, grant: Grant) -> _Applied | None:
    """Re-apply a stored action to this delivery's grant; None when it is malformed or not granted."""
    # Stored rows may have bypassed save-time validation, so every shape is re-checked here.
    if not isinstance(action, Mapping):
        return None
    if "drop" in action:
        if action.get("drop") is True and len(action) == 1:
            return _Applied(drop=True)
        return None
    queue = action.get("queue")
    if not isinstance(queue, str) or not queue or queue not in grant.queues():
        return None
    if any(flag in action and not isinstance(action[flag], bool) for flag in QUEUE_FLAGS):
        return None
    candidates = list(grant.targets)
    if "endpoints" in action:
        endpoints = action["endpoints"]
        if not isinstance(endpoints, list):
            return None
        # Intersection in target order, never in the rule's order: the grant decides precedence.
        wanted = {e for e in endpoints if isinstance(e, str)}
        candidates = [t for t in candidates if t.endpoint_id in wanted]
    if action.get("exclusive") is True:
        scoped = [t for t in candidates if queue in t.scope_queues]
        candidates = scoped[:1]
    if not candidates:
        return None
    return _Applied(deliveries=[Delivery(endpoint_id=t.endpoint_id, queue=queue) for t in candidates])


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


def holding_fault(evaluation: Evaluation, matched_index: int | None) -> Fault | None:
    """Under on_fault "hold", the fault that stops evaluation: the first one before the match (or any, unmatched)."""
    for fault in evaluation.faults:
        # A sandbox-level fault (index -1) concerns the whole list; a fault after the match cannot decide.
        if matched_index is None or fault.rule_index < matched_index:
            return fault
    return None


def _held(evaluation: Evaluation, fault: Fault, rules: list[dict[str, Any]]) -> Decision:
    """The faulted decision: nothing minted, the stopping rule and every fault on the trace."""
    trace: dict[str, Any] = {"stage": "fault", "cause": CAUSE_HELD_ON_FAULT, "rule_index": fault.rule_index}
    if 0 <= fault.rule_index < len(rules):
        rule_id, rule_name = _rule_identity(rules[fault.rule_index])
        if rule_id is not None:
            trace["rule_id"] = rule_id
        if rule_name is not None:
            trace["rule_name"] = rule_name
    trace["faults"] = [f.model_dump(exclude_none=True) for f in evaluation.faults]
    return Decision(disposition="faulted", deliveries=[], trace=trace)


def decide(grant: Grant, evaluation: Evaluation, envelope: dict[str, Any] | None = None) -> Decision:
    """Turn an evaluation into deliveries under the grant recomputed for this delivery."""
    rules = grant.rules
    index = evaluation.matched_index
    # The sandbox child only reports an index; one outside the configured list is ignored.
    if isinstance(index, bool) or index is None or not 0 <= index < len(rules):
        index = None
    if grant.on_fault == "hold":
        fault = holding_fault(evaluation, index)
        if fault is not None:
            return _held(evaluation, fault, rules)

    trace: dict[str, Any] = {}
    action: Any = None
    applied: _Applied | None = None
    rule_id: str | None = None
    rule_name: str | None = None
    stage = "default"
    cause: str | None = CAUSE_NO_MATCH

    if index is not None:
        rule = rules[index]
        rule_id, rule_name = _rule_identity(rule)
        action = rule.get("action") if isinstance(rule, Mapping) else None
        applied = apply_action(action, grant)
        if applied is not None:
            stage, cause = "rule", None
        else:
            # A matched rule that is no longer reachable takes the default; it never falls through.
            cause = CAUSE_RULE_NOT_GRANTED

    if applied is None:
        action = grant.default_action
        if action is None:
            action = {"queue": grant.target_queue}
            applied = _Applied(deliveries=default_deliveries(grant))
        else:
            applied = apply_action(action, grant)
            if applied is None:
                cause = CAUSE_DEFAULT_NOT_GRANTED
                action = {"queue": grant.target_queue}
                applied = _Applied(deliveries=default_deliveries(grant))

    trace["stage"] = stage
    if cause is not None:
        trace["cause"] = cause
    if index is not None:
        trace["rule_index"] = index
        if rule_id is not None:
            trace["rule_id"] = rule_id
        if rule_name is not None:
            trace["rule_name"] = rule_name
    trace["action"] = copy.deepcopy(dict(action))
    if evaluation.faults:
        trace["faults"] = [f.model_dump(exclude_none=True) for f in evaluation.faults]

    if applied.drop:
        return Decision(disposition="dropped", deliveries=[], trace=trace)

    queue = applied.deliveries[0].queue if applied.deliveries else grant.target_queue
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
        work_order = _work_order(
            grant,
            envelope,
            lane=queue,
            stage=stage,
            # The work order names the rule that authorized it, so only a rule stage carries one.
            rule_id=rule_id if stage == "rule" else None,
            rule_name=rule_name if stage == "rule" else None,
        )
    return Decision(
        disposition="routed",
        deliveries=applied.deliveries,
        trace=trace,
        once_key=key,
        work_order=work_order,
        coalesce=coalesce_subject is not None,
        subject_key=coalesce_subject,
    )
