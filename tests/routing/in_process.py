"""The sandbox's rule engine run in this process, with no kill: a stand-in for the sandbox in unit tests.

For tests of other code (filters, rule packs, validation) that need an evaluation or a compile verdict without
child processes, for the engine's own in-process tests, and as bench/rules.py's in-process baseline. It runs
the code under test, so it is never the expected outcome of a sandbox test: those compare against
tests/routing/jq_reference.py (libjq alone, rule by rule) or literal results. Never on a server: nothing here
bounds libjq's memory or kills a runaway rule.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from routing.models import Evaluation, Fault
from routing.rules import compile_failure
from routing.sandbox.engine import RuleEngine
from routing.sandbox.faults import rule_fault, rule_fields, sandbox_failure
from routing.sandbox.protocol import encode_input

_ENGINE = RuleEngine()


def evaluate_in_process(
    rules: list[dict[str, Any]],
    params: dict[str, Any] | None,
    envelope: dict[str, Any],
    *,
    rule_timeout: float = 0.05,
    event_budget: float = 0.25,
) -> Evaluation:
    """SandboxPool.evaluate's result, evaluated here with no kill.

    Rules are timed on this thread's CPU clock, as the sandbox times its children's.
    """
    if not rules:
        return Evaluation()
    try:
        body = encode_input(params, envelope)
    except (TypeError, ValueError) as exc:
        return sandbox_failure(f"event not JSON-encodable: {type(exc).__name__}")
    exprs, rule_ids = rule_fields(rules)
    faults: list[Fault] = []
    plan = _ENGINE.prepare(exprs)  # compiling is not evaluation: the sandbox times rules after it too
    budget_left = event_budget
    started = time.thread_time()

    def parsed(position: int) -> None:  # parsing is not evaluation either: the rule's clock starts after it
        nonlocal started
        started = time.thread_time()

    for index, outcome, detail in _ENGINE.evaluate(plan, exprs, body, parsed=parsed):
        finished = time.thread_time()
        spent, started = finished - started, finished
        budget_left -= spent
        if spent > rule_timeout:
            faults.append(rule_fault(index, rule_ids, "timeout", f"rule used over {rule_timeout * 1000:.0f} ms of CPU"))
        elif outcome == "match":
            return Evaluation(matched_index=index, faults=faults)
        elif outcome != "nomatch":
            faults.append(rule_fault(index, rule_ids, outcome, detail))
        if budget_left <= 0 and index + 1 < len(exprs):
            faults.extend(
                rule_fault(i, rule_ids, "budget_exhausted", "event budget spent") for i in range(index + 1, len(exprs))
            )
            break
    return Evaluation(matched_index=None, faults=faults)


def check_in_process(exprs: Sequence[str]) -> list[str | None]:
    """SandboxPool.check's verdicts, compiled here and unbounded."""
    verdicts: list[str | None] = []
    for expr in exprs:
        error = RuleEngine().prepare([expr]).compile_errors.get(0)
        verdicts.append(None if error is None else compile_failure(error))
    return verdicts
