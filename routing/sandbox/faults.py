"""An evaluation's faults, named by rule index and id: the shape every evaluator of a rule list reports."""

from __future__ import annotations

from typing import Any

from routing.models import Evaluation, Fault


def rule_fields(rules: list[dict[str, Any]]) -> tuple[list[object], list[str | None]]:
    """Each rule's expression (as stored, checked by the child) and id; a malformed rule has neither."""
    maps = [rule if isinstance(rule, dict) else {} for rule in rules]
    ids = [rule.get("id") for rule in maps]
    return [rule.get("expr") for rule in maps], [i if i is None or type(i) is str else str(i) for i in ids]


def rule_fault(index: int, rule_ids: list[str | None], cause: str, detail: str | None) -> Fault:
    """A fault of rule ``index`` (-1: of the sandbox, no rule's)."""
    return Fault.model_validate(
        {
            "rule_index": index,
            "rule_id": rule_ids[index] if index >= 0 else None,
            "cause": cause,
            "detail": detail,
        }
    )


def sandbox_failure(detail: str) -> Evaluation:
    """No match, and a sandbox-level fault saying why nothing was evaluated."""
    return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_failure", detail=detail)])
