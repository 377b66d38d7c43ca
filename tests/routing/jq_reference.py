"""An independent reading of rule evaluation: each rule alone through jq.py's public API, first match wins.

The expected outcome for tests of the sandbox and its engine (routing/sandbox/engine.py), computed without their
code: no combined program, no positions, no try/catch wrapper, no parse hooks; each rule compiled on its own
with ``$params`` bound as a named argument and run on the envelope's JSON text. Only which expressions may run at
all is shared, through the jq policy (routing/jq_policy.py, tested on its own against literal verdicts).

Rule semantics (SPEC-0020): a rule matches when its first output is neither ``false`` nor ``null``; no output is
a miss; an error is an ``error`` fault and the next rule runs; an expression refused by the policy or that does
not compile is a ``compile_error`` fault. Nothing here is bounded: test inputs only.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jq

from routing import jq_policy
from routing.models import Evaluation, Fault

Outcome = Literal["match", "nomatch", "error", "compile_error"]


def reference_outcome(expr: object, params: dict[str, Any] | None, envelope: dict[str, Any]) -> Outcome:
    """One rule's outcome on ``envelope``, read by libjq alone."""
    if not isinstance(expr, str) or jq_policy.verdict(expr) is not None:
        return "compile_error"
    try:
        program = jq.compile(expr, args={"params": params if params is not None else {}})
    except ValueError:
        return "compile_error"
    try:
        outputs = iter(program.input_text(json.dumps(envelope, ensure_ascii=False)))
        first = next(outputs, None)
    except ValueError:
        return "error"
    return "nomatch" if first is None or first is False else "match"


def reference_evaluate(
    rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
) -> Evaluation:
    """The rule list's evaluation: the first matching rule and the faults of the rules before it (no details)."""
    faults: list[Fault] = []
    for index, rule in enumerate(rules):
        outcome = reference_outcome(rule.get("expr"), params, envelope)
        if outcome == "match":
            return Evaluation(matched_index=index, faults=faults)
        if outcome != "nomatch":
            faults.append(Fault(rule_index=index, rule_id=rule.get("id"), cause=outcome, detail=None))
    return Evaluation(faults=faults)


def reference_compiles(expr: str) -> bool:
    """Whether the expression may be saved: the policy allows it and libjq compiles it on its own."""
    if jq_policy.verdict(expr) is not None:
        return False
    try:
        jq.compile(expr, args={"params": {}})
    except ValueError:
        return False
    return True


def decided(evaluation: Evaluation) -> tuple[int | None, list[tuple[int, str]]]:
    """What the reference decides, to compare with any evaluator: the match and each fault's rule and cause."""
    return evaluation.matched_index, [(f.rule_index, f.cause) for f in evaluation.faults]
