"""The routing composition, defined once: evaluate the rules when there are any, then decide.

RouteDelivery, the dry-run, the backtest and the rule-pack tests all route through ``route``. Only the
evaluate step differs between them, so it is a parameter: in the workflow it is the evaluate_rules activity
(the one step with I/O), elsewhere a sandbox pool in this process (``evaluator``). The decision itself is
pure (routing.decision) and runs inside the workflow. Like routing.decision, this module must not need jq:
the workflow imports it inside its sandbox.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from routing.decision import decide
from routing.models import Decision, EvaluateInput, Evaluation, Grant

Evaluate = Callable[[EvaluateInput], Awaitable[Evaluation]]


class RuleEvaluator(Protocol):
    """Evaluates a rule list where a hostile expression cannot hurt the caller (routing.sandbox.SandboxPool)."""

    async def evaluate(
        self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
    ) -> Evaluation:
        """First-match-wins evaluation; faults are recorded, never raised."""
        ...


@dataclass(frozen=True)
class Routed:
    """What routing one envelope came to: the evaluation (empty without rules) and the decision."""

    evaluation: Evaluation
    decision: Decision


def needs_envelope(grant: Grant) -> bool:
    """Whether routing reads the envelope, so a caller may skip parsing the body when it does not."""
    # Rules evaluate it; a configured default may ask for a once-key, coalescing or a work order, which read
    # its subject. A webhook with neither routes to its target queue whatever the body says.
    return bool(grant.rules or grant.default_action)


def evaluation_input(grant: Grant, envelope: dict[str, Any] | None) -> EvaluateInput | None:
    """The evaluate step's input; None when the grant has no rules, so no sandbox child is involved."""
    if not grant.rules:
        return None
    if envelope is None:
        raise ValueError("a grant with rules is routed on an envelope (see needs_envelope)")
    return EvaluateInput(rules=grant.rules, params=grant.params, envelope=envelope)


async def route(grant: Grant, envelope: dict[str, Any] | None, evaluate: Evaluate) -> Routed:
    """Evaluate the grant's rules on the envelope when there are any, then decide under the grant."""
    request = evaluation_input(grant, envelope)
    evaluation = Evaluation() if request is None else await evaluate(request)
    # LLM triage (issue 13) is a second step of this shape: awaited only when the evaluation decided nothing
    # (no reachable rule matched and on_fault did not hold), its answer handed to decide (routing.decision.choose).
    return Routed(evaluation=evaluation, decision=decide(grant, evaluation, envelope))


def evaluator(pool: RuleEvaluator) -> Evaluate:
    """The evaluate step served by a sandbox pool of this process."""

    async def evaluate(request: EvaluateInput) -> Evaluation:
        if request.envelope is None:
            raise ValueError("a sandbox evaluates rules on an envelope")
        return await pool.evaluate(request.rules, request.params, request.envelope)

    return evaluate
