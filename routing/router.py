"""The routing composition, defined once: the trust gate, then evaluate the rules when there are any, then decide.

RouteDelivery, the dry-run, the backtest and the rule-pack tests all route through ``route``. Only the
evaluate step differs between them, so it is a parameter: in the workflow it is the evaluate_rules activity
(the one step with I/O), elsewhere a sandbox pool in this process (``evaluator``). The LLM triage step is a
parameter the same way: the workflow passes its triage activity; the dry-run and the backtest pass none, so
they never call a model and their trace says the stage was not run (llm outcome "not_run"). The trust gate
(routing.trust) comes first: a gated delivery that is neither trusted nor released is quarantined with no rule
evaluated and no model called. The decision itself is pure (routing.decision) and runs inside the workflow. Like
routing.decision, this module must not need jq: the workflow imports it inside its sandbox.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from routing.decision import decide, triage_due
from routing.models import Decision, EvaluateInput, Evaluation, Grant
from routing.triage import TriageInput, TriageResult, projection
from routing.trust import gate_decision

Evaluate = Callable[[EvaluateInput], Awaitable[Evaluation]]
# The triage step: the activity's result.
Triage = Callable[[TriageInput], Awaitable[TriageResult]]


class RuleEvaluator(Protocol):
    """Evaluates a rule list where a hostile expression cannot hurt the caller (routing.sandbox.SandboxPool)."""

    async def evaluate(
        self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
    ) -> Evaluation:
        """First-match-wins evaluation; faults are recorded, never raised."""
        ...


@dataclass(frozen=True)
class Routed:
    """What routing one envelope came to: the evaluation (empty without rules), triage's result when it ran, and
    the decision."""

    evaluation: Evaluation
    decision: Decision
    triage: TriageResult | None = None


def needs_envelope(grant: Grant) -> bool:
    """Whether routing reads the envelope, so a caller may skip parsing the body when it does not."""
    # Rules evaluate it; a configured default may ask for a once-key, coalescing or a work order, which read
    # its subject. A webhook with neither routes to its target queue whatever the body says.
    # Triage sends a projection of it to the model; the trust gate reads its .actor and .release.
    return bool(grant.rules or grant.default_action or grant.llm_triage or grant.trusted_actors is not None)


def evaluation_input(grant: Grant, envelope: dict[str, Any] | None) -> EvaluateInput | None:
    """The evaluate step's input; None when the grant has no rules, so no sandbox child is involved."""
    if not grant.rules:
        return None
    if envelope is None:
        raise ValueError("a grant with rules is routed on an envelope (see needs_envelope)")
    return EvaluateInput(rules=grant.rules, params=grant.params, envelope=envelope)


def triage_input(grant: Grant, evaluation: Evaluation, envelope: dict[str, Any] | None) -> TriageInput | None:
    """The triage step's input when the stage is due (configured, no rule matched, not held), else None."""
    config = grant.llm_triage
    if config is None or envelope is None or not triage_due(grant, evaluation):
        return None
    return TriageInput(
        webhook_id=grant.webhook_id,
        endpoint_id=grant.owner_endpoint_id,
        config=config,
        projection=projection(envelope, include_payload=config.include_payload),
    )


async def route(
    grant: Grant, envelope: dict[str, Any] | None, evaluate: Evaluate, triage: Triage | None = None
) -> Routed:
    """Hold the delivery at the trust gate, or evaluate the grant's rules on the envelope when there are any,
    triage when due and a step is given, then decide under the grant."""
    gated = gate_decision(grant, envelope)
    if gated is not None:
        return Routed(evaluation=Evaluation(), decision=gated)
    request = evaluation_input(grant, envelope)
    evaluation = Evaluation() if request is None else await evaluate(request)
    # Triage is awaited only when the evaluation decided nothing (no rule matched, on_fault did not hold):
    # a delivery a rule decides never waits on a model or spends its budget.
    result: TriageResult | None = None
    asked = triage_input(grant, evaluation, envelope) if triage is not None else None
    if triage is not None and asked is not None:
        result = await triage(asked)
    return Routed(evaluation=evaluation, decision=decide(grant, evaluation, envelope, result), triage=result)


def evaluator(pool: RuleEvaluator) -> Evaluate:
    """The evaluate step served by a sandbox pool of this process."""

    async def evaluate(request: EvaluateInput) -> Evaluation:
        return await pool.evaluate(request.rules, request.params, request.envelope)

    return evaluate
