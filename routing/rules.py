"""Routing rules: shape, action parsing and save-time validation (expressions through routing.jq_policy)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel

from routing import jq_policy
from routing.actions import ACTION_KEYS as ACTION_KEYS
from routing.actions import MAX_ENDPOINTS as MAX_ENDPOINTS
from routing.actions import QUEUE_FLAGS as QUEUE_FLAGS
from routing.actions import parse_action as parse_action
from routing.models import Grant

MAX_RULES = 32
MAX_ID_CHARS = 64
MAX_NAME_BYTES = 128
MAX_EXPR_BYTES = 4096
MAX_PARAMS_BYTES = 16 * 1024
RULE_KEYS = frozenset({"id", "name", "expr", "action"})
RULE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

# A save whose rules error or time out on the webhook's recent stored events (routing.backtest.recent_faults).
RULE_FAULTS_ON_RECENT_EVENTS = "rule_faults_on_recent_events"
ERROR_CODES = (
    "invalid_expression",
    "forbidden_function",
    "invalid_rule",
    "too_many_rules",
    "invalid_params",
    "not_granted",
    RULE_FAULTS_ON_RECENT_EVENTS,
)


class RuleValidationError(Exception):
    """A rejected save: a stable code, a message naming the offending rule, and the rule's identity."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        rule_index: int | None = None,
        rule_id: str | None = None,
        rule_name: str | None = None,
    ) -> None:
        """Keep the code and the offending rule's index, id and name beside the message."""
        super().__init__(message)
        self.code = code
        self.message = message
        self.rule_index = rule_index
        self.rule_id = rule_id
        self.rule_name = rule_name

    def to_dict(self) -> dict[str, Any]:
        """The error as a JSON-able object for verb responses."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.rule_index is not None:
            out["rule_index"] = self.rule_index
        if self.rule_id is not None:
            out["rule_id"] = self.rule_id
        if self.rule_name is not None:
            out["rule_name"] = self.rule_name
        return out


def mint_rule_id() -> str:
    """A fresh rule id inside the id charset; only used at save time, never on the delivery path."""
    return "r_" + secrets.token_hex(6)


# ---------------------------------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------------------------------


# Expression → the sandbox's compile verdict: None when it compiles, else the invalid_expression detail.
Compiled = Mapping[str, str | None]

COMPILE_LIMIT = "compiling exceeds the sandbox's memory or time limit"
NOT_CHECKED = "expression was not compile-checked in the sandbox; nothing is saved unchecked"


class CompileCheckUnavailable(Exception):
    """The sandbox could not compile-check a save's expressions (no slot in time, or closed)."""


class CompileChecker(Protocol):
    """Compiles expressions where a failing libjq cannot hurt the caller (routing.sandbox.SandboxPool)."""

    async def check(self, exprs: Sequence[str]) -> list[str | None]:
        """Per expression None, or the invalid_expression detail; raises CompileCheckUnavailable."""
        ...


def compile_failure(error: str) -> str:
    """The invalid_expression detail for a compile error reported by libjq."""
    return f"expression does not compile: {error}"


def compile_candidates(rules: Any) -> list[str]:
    """The distinct expressions validate_rules will compile-check: those past every cheaper check before it.

    Only strings within the size limit that the jq policy accepts, of a list within the rule limit: the
    sandbox never compiles what validation refuses first.
    """
    if not isinstance(rules, list) or len(rules) > MAX_RULES:
        return []
    out: dict[str, None] = {}
    for rule in rules:
        expr = rule.get("expr") if isinstance(rule, dict) else None
        if isinstance(expr, str) and len(expr.encode("utf-8")) <= MAX_EXPR_BYTES and jq_policy.verdict(expr) is None:
            out[expr] = None
    return list(out)


async def compile_verdicts(rules: Any, checker: CompileChecker, known: Compiled | None = None) -> dict[str, str | None]:
    """The sandbox's compile verdicts for a candidate list's expressions, reusing those already ``known``."""
    verdicts = dict(known or {})
    todo = [expr for expr in compile_candidates(rules) if expr not in verdicts]
    if todo:
        verdicts.update(zip(todo, await checker.check(todo), strict=True))
    return verdicts


def check_expression(expr: str, compiled: Compiled | None = None) -> tuple[str, str] | None:
    """None when the expression is acceptable, else (code, detail): the jq policy first, then compiling.

    The policy is routing/jq_policy.py, the same verdict the sandbox child applies before compiling. The
    compile verdict is the child's own (``compiled``, from SandboxPool.check: RuleEngine.prepare in a capped
    child), because libjq folds constants while compiling and would spend, or abort, this process. What is
    accepted here never meets a compile_error at evaluation. No verdict for the expression fails closed.
    """
    refused = jq_policy.verdict(expr)
    if refused is not None:
        return refused.code, refused.detail
    if compiled is None or expr not in compiled:
        return jq_policy.INVALID, NOT_CHECKED
    detail = compiled[expr]
    if detail is not None:
        return jq_policy.INVALID, detail
    return None


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def describe_rule(index: int, rule_id: str | None, rule_name: str | None) -> str:
    """`rule index 2 (id "x", name "y")`: how every message names a rule (indexes count from 0, as in the list)."""
    parts = []
    if rule_id is not None:
        parts.append(f"id {json.dumps(rule_id, ensure_ascii=False)}")
    if rule_name is not None:
        parts.append(f"name {json.dumps(rule_name, ensure_ascii=False)}")
    return f"rule index {index}" + (f" ({', '.join(parts)})" if parts else "")


@dataclass(frozen=True)
class _Where:
    """Which rule (or the default_action) an error names."""

    label: str
    index: int | None = None
    rule_id: str | None = None
    rule_name: str | None = None

    def error(self, code: str, detail: str) -> RuleValidationError:
        """An error whose message starts by naming the rule."""
        return RuleValidationError(
            code,
            f"{self.label}: {detail}",
            rule_index=self.index,
            rule_id=self.rule_id,
            rule_name=self.rule_name,
        )


def validate_params(params: Any) -> dict[str, Any]:
    """Params: a JSON object of at most 16 KiB encoded; None binds as an empty object."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RuleValidationError("invalid_params", "params must be a JSON object")
    try:
        encoded = json.dumps(params, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RuleValidationError("invalid_params", f"params are not encodable JSON: {exc}") from exc
    size = len(encoded.encode("utf-8"))
    if size > MAX_PARAMS_BYTES:
        raise RuleValidationError("invalid_params", f"params are {size} bytes encoded; the limit is {MAX_PARAMS_BYTES}")
    # Round-trip so the stored value is plain JSON (no tuples, no subclasses).
    normalized: dict[str, Any] = json.loads(encoded)
    return normalized


def check_action_granted(action: Mapping[str, Any], grant: Grant) -> str | None:
    """None when a parsed action is reachable under the grant, else the reason it is not."""
    if action.get("drop") is True or action.get("quarantine") is True:
        return None
    queue = action["queue"]
    if queue not in grant.queues():
        return f"queue {json.dumps(queue)} is not granted (granted: {', '.join(grant.queues())})"
    target_ids = [t.endpoint_id for t in grant.targets]
    endpoints = action.get("endpoints")
    if endpoints is not None:
        for endpoint in endpoints:
            if endpoint not in target_ids:
                return f"endpoint {json.dumps(endpoint)} is not a delivery target of this webhook"
        candidates = [t for t in grant.targets if t.endpoint_id in endpoints]
    else:
        candidates = list(grant.targets)
    if not candidates:
        return "the webhook has no live delivery targets"
    if action.get("exclusive") is True and not any(queue in t.scope_queues for t in candidates):
        return f"exclusive: no candidate target's scope includes queue {json.dumps(queue)}"
    return None


def validate_action(action: Any, grant: Grant, *, where: _Where | None = None) -> dict[str, Any]:
    """Parse an action and check it against the grant; raise invalid_rule or not_granted."""
    where = where or _Where("default_action")
    try:
        parsed = parse_action(action)
    except ValueError as exc:
        raise where.error("invalid_rule", str(exc)) from exc
    reason = check_action_granted(parsed, grant)
    if reason is not None:
        raise where.error("not_granted", reason)
    return parsed


def validate_default_action(default_action: Any, grant: Grant) -> dict[str, Any] | None:
    """The configured default, checked like a rule action; None means the target queue on every target."""
    if default_action is None:
        return None
    return validate_action(default_action, grant, where=_Where("default_action"))


def _validate_rule(
    index: int,
    rule: Any,
    grant: Grant,
    seen_ids: set[str],
    mint_id: Callable[[], str],
    taken_ids: set[str],
    compiled: Compiled | None,
) -> dict[str, Any]:
    """One rule, in the order: shape, id, name, expression, action."""
    if not isinstance(rule, dict):
        raise _Where(describe_rule(index, None, None), index).error("invalid_rule", "a rule must be an object")
    raw_id = rule.get("id")
    raw_name = rule.get("name")
    shown_id = raw_id if isinstance(raw_id, str) else None
    shown_name = raw_name if isinstance(raw_name, str) else None
    where = _Where(describe_rule(index, shown_id, shown_name), index, shown_id, shown_name)
    fail = where.error
    unknown = sorted(str(k) for k in rule if k not in RULE_KEYS)
    if unknown:
        raise fail("invalid_rule", f"unknown field(s): {', '.join(unknown)}")
    if "id" not in rule or raw_id is None:
        # Ids are minted when omitted, never colliding with an id the list already uses.
        rule_id = mint_id()
        while rule_id in taken_ids or rule_id in seen_ids:
            rule_id = mint_id()
    elif not isinstance(raw_id, str) or not RULE_ID_RE.fullmatch(raw_id):
        raise fail("invalid_rule", f"id must be 1–{MAX_ID_CHARS} characters of [A-Za-z0-9_-]")
    else:
        rule_id = raw_id
    if rule_id in seen_ids:
        raise fail("invalid_rule", f"id {json.dumps(rule_id)} is used by an earlier rule")
    seen_ids.add(rule_id)
    if raw_name is not None:
        if not isinstance(raw_name, str):
            raise fail("invalid_rule", "name must be a string")
        if len(raw_name.encode("utf-8")) > MAX_NAME_BYTES:
            raise fail("invalid_rule", f"name is longer than {MAX_NAME_BYTES} bytes")
    expr = rule.get("expr")
    if not isinstance(expr, str):
        raise fail("invalid_rule", "expr must be a string")
    if len(expr.encode("utf-8")) > MAX_EXPR_BYTES:
        raise fail("invalid_rule", f"expr is longer than {MAX_EXPR_BYTES} bytes")
    problem = check_expression(expr, compiled)
    if problem is not None:
        raise fail(*problem)
    if "action" not in rule:
        raise fail("invalid_rule", "action is required")
    # A minted id names the rule from here on, so a grant failure says which rule it minted.
    where = _Where(describe_rule(index, rule_id, shown_name), index, rule_id, shown_name)
    action = validate_action(rule["action"], grant, where=where)
    out: dict[str, Any] = {"id": rule_id}
    if raw_name is not None:
        out["name"] = raw_name
    out["expr"] = expr
    out["action"] = action
    return out


def validate_rules(
    rules: Any,
    default_action: Any,
    params: Any,
    grant: Grant,
    *,
    compiled: Compiled | None = None,
    mint_id: Callable[[], str] = mint_rule_id,
) -> list[dict[str, Any]]:
    """Validate a whole routing configuration at save time; return the normalized rules or raise.

    ``compiled`` holds the sandbox's compile verdicts (compile_verdicts); an expression without one is refused.
    """
    validate_params(params)
    if not isinstance(rules, list):
        raise RuleValidationError("invalid_rule", "rules must be a list")
    if len(rules) > MAX_RULES:
        # Name the first rule past the limit, so the message points at what to remove.
        extra = rules[MAX_RULES]
        extra_id = extra.get("id") if isinstance(extra, dict) else None
        extra_name = extra.get("name") if isinstance(extra, dict) else None
        shown_id = extra_id if isinstance(extra_id, str) else None
        shown_name = extra_name if isinstance(extra_name, str) else None
        where = _Where(describe_rule(MAX_RULES, shown_id, shown_name), MAX_RULES, shown_id, shown_name)
        raise where.error("too_many_rules", f"{len(rules)} rules; the limit is {MAX_RULES}")
    taken = {r["id"] for r in rules if isinstance(r, dict) and isinstance(r.get("id"), str)}
    seen: set[str] = set()
    out = [_validate_rule(i, rule, grant, seen, mint_id, taken, compiled) for i, rule in enumerate(rules)]
    validate_default_action(default_action, grant)
    return out


class Candidate(BaseModel):
    """A configuration to validate (and save, or try): rules (raw, ids may be missing), default, params, on_fault."""

    rules: list[Any]
    default_action: Any = None
    params: Any = None
    on_fault: Any = "continue"


def validate_config(
    rules: Any,
    default_action: Any,
    params: Any,
    grant: Grant,
    *,
    compiled: Compiled | None = None,
    mint_id: Callable[[], str] = mint_rule_id,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any]]:
    """validate_rules plus the normalized default_action and params, ready to store together."""
    normalized = validate_rules(rules, default_action, params, grant, compiled=compiled, mint_id=mint_id)
    return normalized, validate_default_action(default_action, grant), validate_params(params)
