"""The filter language compiled to jq: deterministic, every path segment and value quoted as JSON."""

from __future__ import annotations

import json
from typing import Any

from routing.filters.language import AllOf, AnyOf, Condition, Drop, Eq, Exists, FilterAnswer, In, parse_path

# The one traversal every path condition uses: a recursive def over the path's keys as a JSON array, so a
# key is only ever a JSON string literal (never spliced as jq code). Its name starts with one underscore:
# the sandbox reserves "__" names, and a rule's own def shadows nothing the rule does not call.
_PRELUDE = (
    "def _sb_at($p): if ($p | length) == 0 then (., (arrays | .[])) else"
    ' (if type == "object" then (select(has($p[0])) | .[$p[0]])'
    ' elif type == "array" then (.[] | objects | select(has($p[0])) | .[$p[0]])'
    " else empty end) | _sb_at($p[1:]) end; "
)


def _literal(value: Any) -> str:
    # JSON is jq literal syntax; ASCII escapes keep every byte of the expression printable, and json.dumps
    # escapes backslashes, so no "\(" interpolation can appear.
    return json.dumps(value, ensure_ascii=True, allow_nan=False)


def _cond_jq(cond: Condition) -> str:
    if isinstance(cond, Eq | In | Exists):
        at = f"_sb_at({_literal(list(parse_path(cond.path)))})"
        if isinstance(cond, Eq):
            return f"any({at}; . == {_literal(cond.value)})"
        if isinstance(cond, In):
            return f"any({at}; IN({', '.join(_literal(v) for v in cond.values)}))"
        return f"any({at}; . != null)"
    if isinstance(cond, AllOf):
        return "(" + " and ".join(_cond_jq(sub) for sub in cond.of) + ")"
    if isinstance(cond, AnyOf):
        return "(" + " or ".join(_cond_jq(sub) for sub in cond.of) + ")"
    return f"({_cond_jq(cond.of)} | not)"


def to_jq(answer: FilterAnswer) -> str:
    """The rule expression of a filter: one boolean output, true exactly when ``matches`` is true."""
    parts = []
    if answer.kinds:
        parts.append(f"(.kind | IN({', '.join(_literal(k) for k in answer.kinds)}))")
    if answer.where is not None:
        parts.append(_cond_jq(answer.where))
    body = " and ".join(parts) if parts else "true"
    return (_PRELUDE + body) if answer.where is not None else body


def action_of(answer: FilterAnswer) -> dict[str, Any]:
    """The rule action, in routing.rules' shape."""
    if isinstance(answer.action, Drop):
        return {"drop": True}
    return {"queue": answer.action.queue}
