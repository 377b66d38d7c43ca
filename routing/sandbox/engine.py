"""The rule engine the sandbox child runs: a webhook's rule list as one jq program, first match wins.

:class:`RuleEngine` compiles a rule list once (cached) into one combined program, so libjq parses the envelope
once per event, not once per rule, and evaluates it lazily, one rule at a time, so its caller can time (or be
killed during) exactly one rule. The child process (routing/sandbox/child_main.py) runs it under its clocks and
caps; tests and benches run it in their own process, where nothing bounds it.

This module imports nothing but the standard library, ``jq``, the stdlib-only jq policy (routing/jq_policy.py)
and routing/sandbox/jq_bytes.py (how the input reaches jq.py undecoded), so a freshly executed child stays small
enough for an address-space cap to bound libjq (which aborts the process on allocation failure).
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Final, Literal

import jq

from routing import jq_policy
from routing.sandbox.jq_bytes import as_text

# The combined program's first output, emitted once libjq has parsed the input and before any rule runs.
PARSED: Final = "parsed"

Outcome = Literal["match", "nomatch", "error", "compile_error"]

_DETAIL_MAX = 160
_LINE = re.compile(r"\bline (\d+)")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def refusal(expr: str) -> str | None:
    """Why the jq policy refuses an expression before compiling it, or None (routing/jq_policy.py).

    The same verdict refuses the rule at save time, so only rules stored before a policy change meet it
    here; refusing them keeps evaluation pure all the same.
    """
    why = jq_policy.verdict(expr)
    return None if why is None else why.detail


def short_detail(message: str) -> str:
    """A fault detail that fits a trace line and carries no quoted payload text."""
    first = message.strip().splitlines()[0] if message.strip() else "error"
    first = _QUOTED.sub('"…"', first)
    return first if len(first) <= _DETAIL_MAX else first[: _DETAIL_MAX - 1] + "…"


def _segment(position: int, expr: str) -> str:
    """One rule inside the combined program: one output (``position`` for a miss, ``[position, "match"]`` or
    ``[position, "error", detail]``), or none when the request starts after it.

    The rule sits alone between its own parentheses on its own lines; refusal() has checked that its
    brackets balance, so it parses as one term exactly as it would on its own and cannot reach its
    neighbours.
    """
    return (
        f"(if $__sbx_start > {position} then empty else"
        f" try ([first((\n{expr}\n)) | (. != null and . != false)]"
        # .[0:1]: libjq's ?// can emit first()'s one value twice; the rule's first output is what decides.
        # A miss, by far the most common outcome, is the bare position: the cheapest value to hand to Python.
        f' | .[0:1] | if . == [true] then [{position}, "match"] else {position} end)'
        f' catch [{position}, "error", (if type == "string" then . else tojson end)] end)'
    )


def _combined(exprs: list[tuple[int, str]]) -> str:
    """One program for a whole rule list, so the envelope is parsed once per event, not once per rule.

    The input is ``[params, envelope, start]``: ``$params`` is not compiled in, so the program is shared
    by every webhook with the same rules, and a request can resume the list after a killed rule without
    compiling anything new.
    """
    body = ",\n".join(_segment(position, expr) for position, expr in exprs)
    # libjq parses the input before the program starts, so the PARSED output marks the end of the parse.
    return f'"{PARSED}", (.[0] as $params | .[2] as $__sbx_start | .[1] | (\n{body}\n))'


def program_input(body: bytes | memoryview, position: int) -> str:
    """libjq's input for a run from rule ``position``: the ``[params, envelope]`` body with the start appended."""
    return as_text(b"".join((body[:-1], b",%d]" % position)))  # one copy, even from a memoryview of the body slot


class _Plan:
    """A rule list made ready: one compiled program for the rules that compile, details for the rest."""

    def __init__(self, program: Any, compile_errors: dict[int, str]) -> None:
        self.program = program
        self.compile_errors = compile_errors


class RuleEngine:
    """Compiles rule lists once (LRU) and evaluates them first-match-wins, one result at a time."""

    def __init__(self, plan_cache_size: int = 64, rule_cache_size: int = 1024) -> None:
        self._plans: OrderedDict[tuple[object, ...], _Plan] = OrderedDict()
        self._encoded: OrderedDict[bytes, tuple[list[object], _Plan]] = OrderedDict()  # by the exprs field
        self._rule_errors: OrderedDict[str, str | None] = OrderedDict()  # expr → compile error or None
        self._plan_cache_size = plan_cache_size
        self._rule_cache_size = rule_cache_size

    def prepare(self, exprs: list[object]) -> _Plan:
        """The compiled plan for a rule list (cached); compiling happens here, before any rule runs."""
        key = tuple(exprs)
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        errors: dict[int, str] = {}
        for position, expr in enumerate(exprs):
            why = refusal(expr) if isinstance(expr, str) else "expr is not a string"
            if why is not None:
                errors[position] = why
        good = [(p, e) for p, e in enumerate(exprs) if p not in errors and isinstance(e, str)]
        try:
            program = jq.compile(_combined(good)) if good else None
        except ValueError:
            # Rare: find the rules that do not compile on their own, then combine the rest.
            for position, expr in good:
                error = self._rule_error(expr)
                if error is not None:
                    errors[position] = error
            good = [(p, e) for p, e in good if p not in errors]
            program = jq.compile(_combined(good)) if good else None
        plan = _Plan(program, errors)
        self._plans[key] = plan
        if len(self._plans) > self._plan_cache_size:
            self._plans.popitem(last=False)
        return plan

    def prepare_encoded(self, raw: bytes) -> tuple[list[object], _Plan]:
        """The rule list in a request's exprs field and its plan, cached by those bytes (no JSON decode on a hit)."""
        hit = self._encoded.get(raw)
        if hit is not None:
            self._encoded.move_to_end(raw)
            return hit
        exprs = json.loads(raw)
        if not isinstance(exprs, list):
            raise ValueError("exprs is not a list")
        entry = (exprs, self.prepare(exprs))
        self._encoded[raw] = entry
        if len(self._encoded) > self._plan_cache_size:
            self._encoded.popitem(last=False)
        return entry

    def _rule_error(self, expr: str) -> str | None:
        if expr in self._rule_errors:
            return self._rule_errors[expr]
        error: str | None = None
        try:
            jq.compile(_combined([(0, expr)]))
        except ValueError as exc:
            # The rule starts on line 3 of the combined program; report lines as the author wrote them.
            message = _LINE.sub(lambda m: f"line {int(m[1]) - 2}", str(exc).removeprefix("jq: error: "))
            error = short_detail(message)
        self._rule_errors[expr] = error
        if len(self._rule_errors) > self._rule_cache_size:
            self._rule_errors.popitem(last=False)
        return error

    def evaluate(
        self,
        plan: _Plan,
        exprs: list[object],
        body: bytes | memoryview,
        start: int = 0,
        *,
        parsing: Callable[[int], None] | None = None,
        parsed: Callable[[int], None] | None = None,
        started: Callable[[int], None] | None = None,
        misses: bool = True,
    ) -> Iterator[tuple[int, Outcome, str | None]]:
        """Lazily yield ``(position, outcome, detail)`` per rule from ``start``, stopping after a match.

        ``body`` is the ``[params, envelope]`` input as compact UTF-8 JSON. Each rule runs only when the next result
        is pulled, so a caller can time (or be killed during) exactly one rule at a time. ``parsing(position)``
        is called before libjq parses the input and ``parsed(position)`` once it has, before rule
        ``position`` runs: the parse belongs to no rule, so callers stop their rule clocks in between.
        ``started(position)`` is called when the run moves on to rule ``position`` (``len(exprs)`` after the last),
        before it runs. ``misses=False`` yields only faults and the match: a caller that times rules through
        ``started`` pays nothing per miss but that call (the sandbox child; most rules miss).
        """
        errors = plan.compile_errors
        position = start
        while position < len(exprs):
            if plan.program is not None and parsing is not None:
                parsing(position)
            results: Iterator[object] = iter(())
            if plan.program is not None:
                failure: str | None = None
                try:
                    results = iter(plan.program.input_text(program_input(body, position)))
                    if next(results) != PARSED:
                        failure = "unexpected rule output"
                except Exception as exc:  # the input itself did not parse: charged to no rule's clock
                    failure = short_detail(str(exc))
                if parsed is not None:
                    parsed(position)
                if failure is not None:
                    # Cannot happen with the parent's encoder; if it does, each rule faults (no silent match).
                    yield position, "error", failure
                    position += 1
                    continue
            while position < len(exprs):
                if errors and position in errors:
                    yield position, "compile_error", errors[position]
                    position += 1
                    if started is not None:
                        started(position)
                    continue
                try:
                    result = next(results)
                except Exception as exc:  # an error try/catch could not hold: this rule's; the run is spent
                    yield position, "error", short_detail(str(exc))
                    position += 1
                    break
                if type(result) is int and result == position:  # a miss
                    if misses:
                        yield position, "nomatch", None
                    position += 1
                    if started is not None:
                        started(position)
                    continue
                if not (isinstance(result, list) and len(result) >= 2 and result[0] == position):
                    yield position, "error", "unexpected rule output"
                    position += 1
                    break
                if result[1] == "match":
                    yield position, "match", None
                    return
                if result[1] == "error":
                    yield position, "error", short_detail(str(result[2]) if len(result) > 2 else "error")
                elif misses:
                    yield position, "nomatch", None
                position += 1
                if started is not None:
                    started(position)
