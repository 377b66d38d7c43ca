"""The pure decision: apply the matched rule (or the default) to the grant and write the trace."""

from __future__ import annotations

from typing import Any

from routing.models import Decision, Delivery, Evaluation, Grant


def default_deliveries(grant: Grant) -> list[Delivery]:
    """The webhook's target queue on every live target, in target order."""
    return [Delivery(endpoint_id=t.endpoint_id, queue=grant.target_queue) for t in grant.targets]


def decide(grant: Grant, evaluation: Evaluation, envelope: dict[str, Any] | None = None) -> Decision:
    """Turn an evaluation into deliveries under the grant recomputed for this delivery."""
    action: dict[str, Any] = {"queue": grant.target_queue}
    trace: dict[str, Any] = {"stage": "default", "cause": "no_match_default", "action": action}
    if evaluation.faults:
        trace["faults"] = [f.model_dump(exclude_none=True) for f in evaluation.faults]
    return Decision(disposition="routed", deliveries=default_deliveries(grant), trace=trace)
