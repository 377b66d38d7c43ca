"""The filter language's semantics in Python: the oracle the property tests hold the compiled jq to.

Written from the language's rules (routing/filters/language.py's docstring), never from the jq it is checked
against.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from routing.filters.language import AllOf, AnyOf, Condition, Eq, Exists, FilterAnswer, In, json_equal, parse_path


def values_at(document: Any, segments: Sequence[str]) -> list[Any]:
    """The values a path reaches (arrays crossed implicitly), plus the elements of the arrays it reaches."""
    current = [document]
    for key in segments:
        following: list[Any] = []
        for value in current:
            if isinstance(value, dict):
                if key in value:
                    following.append(value[key])
            elif isinstance(value, list):
                following.extend(e[key] for e in value if isinstance(e, dict) and key in e)
        current = following
    out: list[Any] = []
    for value in current:
        out.append(value)
        if isinstance(value, list):
            out.extend(value)
    return out


def holds(cond: Condition, envelope: Mapping[str, Any]) -> bool:
    """The condition on an envelope, in Python."""
    if isinstance(cond, Eq | In | Exists):
        found = values_at(envelope, parse_path(cond.path))
        if isinstance(cond, Eq):
            return any(json_equal(v, cond.value) for v in found)
        if isinstance(cond, In):
            return any(json_equal(v, w) for v in found for w in cond.values)
        return any(v is not None for v in found)
    if isinstance(cond, AllOf):
        return all(holds(sub, envelope) for sub in cond.of)
    if isinstance(cond, AnyOf):
        return any(holds(sub, envelope) for sub in cond.of)
    return not holds(cond.of, envelope)


def matches(answer: FilterAnswer, envelope: Mapping[str, Any]) -> bool:
    """Whether the filter matches an envelope: the Python reading of to_jq's expression."""
    if answer.kinds and not any(json_equal(envelope.get("kind"), k) for k in answer.kinds):
        return False
    return answer.where is None or holds(answer.where, envelope)
