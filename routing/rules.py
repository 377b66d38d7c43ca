"""Routing rules: shape, action parsing, save-time validation and the jq forbidden-function scan."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jq

from routing.models import Grant
from routing.sandbox_child import REFUSED_FUNCTIONS

MAX_RULES = 32
MAX_ID_CHARS = 64
MAX_NAME_BYTES = 128
MAX_EXPR_BYTES = 4096
MAX_ENDPOINTS = 16
MAX_PARAMS_BYTES = 16 * 1024
RULE_KEYS = frozenset({"id", "name", "expr", "action"})
QUEUE_FLAGS = ("exclusive", "once", "work_order", "coalesce")
ACTION_KEYS = frozenset({"queue", "endpoints", "drop", *QUEUE_FLAGS})
RULE_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
PARAMS_VAR = "params"

# Functions that read outside the envelope (environment, input stream, clock, files, modules) or write
# outside the evaluation (stderr, exit codes). The compile check cannot catch them: libjq defines them.
FORBIDDEN_FUNCTIONS = REFUSED_FUNCTIONS - {"import", "include"}  # those two are refused as keywords
# Variables libjq defines on its own; all of them describe the process, not the envelope.
FORBIDDEN_VARIABLES = frozenset({"ENV", "__loc__", "__prog_args", "__prog_name", "ARGS"})
# Module directives: expressions compile with no module loader.
FORBIDDEN_KEYWORDS = frozenset({"import", "include", "module"})
KEYWORDS = frozenset(
    {
        "as",
        "def",
        "if",
        "then",
        "elif",
        "else",
        "end",
        "and",
        "or",
        "reduce",
        "foreach",
        "try",
        "catch",
        "label",
        "import",
        "include",
        "module",
        "__loc__",
    }
)

ERROR_CODES = (
    "invalid_expression",
    "forbidden_function",
    "invalid_rule",
    "too_many_rules",
    "invalid_params",
    "not_granted",
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


class JqSyntaxError(ValueError):
    """The tokenizer could not lex the expression (jq would not either)."""


@dataclass(frozen=True)
class Token:
    """One jq token: kind is ident, field, var, format, keyword, number, op, str_start/str_end, interp."""

    kind: str
    value: str
    pos: int


def mint_rule_id() -> str:
    """A fresh rule id inside the id charset; only used at save time, never on the delivery path."""
    return "r_" + secrets.token_hex(6)


# ---------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------

_IDENT_START = re.compile(r"[A-Za-z_]")
_IDENT = re.compile(r"(?:[A-Za-z_][A-Za-z_0-9]*::)*[A-Za-z_][A-Za-z_0-9]*")
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FORMAT = re.compile(r"@[A-Za-z0-9_]+")
_OPERATORS = (
    "?//",
    "//=",
    "|=",
    "+=",
    "-=",
    "*=",
    "/=",
    "%=",
    "==",
    "!=",
    "<=",
    ">=",
    "//",
    "..",
)


class _Lexer:
    """A jq 1.7 lexer faithful where it matters: strings, interpolation, comments, fields, variables."""

    def __init__(self, text: str) -> None:
        """Lex text from the start."""
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []

    def run(self) -> list[Token]:
        """Lex the whole program."""
        self._code(interpolation=False)
        if self.pos < len(self.text):
            raise JqSyntaxError(f"unexpected ')' at offset {self.pos}")
        return self.tokens

    def _skip_comment(self) -> None:
        """Skip a # comment; jq 1.7.1 lets a backslash continue it across the newline (and CRLF)."""
        text = self.text
        i = self.pos + 1
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                # The backslash escapes the next character, or a CRLF pair, so the comment goes on.
                i += 3 if text.startswith("\r\n", i + 1) else 2
                continue
            if ch == "\n":
                break
            i += 1
        self.pos = min(i, len(text))

    def _code(self, *, interpolation: bool) -> None:
        """Lex code until end of text, or the ')' that closes an interpolation."""
        text = self.text
        depth = 0
        while self.pos < len(text):
            ch = text[self.pos]
            start = self.pos
            if ch in " \t\r\n\f\v":
                self.pos += 1
            elif ch == "#":
                self._skip_comment()
            elif ch == '"':
                self._string()
            elif ch == "$":
                self.pos += 1
                # jq 1.7 rejects "$ name", but a permissive reading can only over-refuse, never miss.
                while self.pos < len(text) and text[self.pos] in " \t\r\n":
                    self.pos += 1
                match = _IDENT.match(text, self.pos)
                if match is None:
                    raise JqSyntaxError(f"'$' without a name at offset {start}")
                self.pos = match.end()
                self.tokens.append(Token("var", match.group(0), start))
            elif ch == "@":
                match = _FORMAT.match(text, self.pos)
                if match is None:
                    raise JqSyntaxError(f"bad format at offset {start}")
                self.pos = match.end()
                self.tokens.append(Token("format", match.group(0), start))
            elif ch == "." and self.pos + 1 < len(text) and _IDENT_START.match(text, self.pos + 1):
                # ".name" is one FIELD token in jq: an index, never a call, whatever the name.
                match = _IDENT.match(text, self.pos + 1)
                assert match is not None
                name = match.group(0)
                if "::" in name:
                    raise JqSyntaxError(f"bad field name at offset {start}")
                self.pos = match.end()
                self.tokens.append(Token("field", name, start))
            elif ch.isdigit() or (ch == "." and self.pos + 1 < len(text) and text[self.pos + 1].isdigit()):
                match = _NUMBER.match(text, self.pos)
                assert match is not None
                self.pos = match.end()
                self.tokens.append(Token("number", match.group(0), start))
            elif _IDENT_START.match(ch):
                match = _IDENT.match(text, self.pos)
                assert match is not None
                self.pos = match.end()
                word = match.group(0)
                self.tokens.append(Token("keyword" if word in KEYWORDS else "ident", word, start))
            else:
                op = next((o for o in _OPERATORS if text.startswith(o, self.pos)), ch)
                self.pos += len(op)
                if op in "([{":
                    depth += 1
                elif op in ")]}":
                    if op == ")" and depth == 0 and interpolation:
                        self.pos -= 1
                        return
                    depth -= 1
                    if depth < 0:
                        raise JqSyntaxError(f"unbalanced {op!r} at offset {start}")
                self.tokens.append(Token("op", op, start))
        if interpolation:
            raise JqSyntaxError("unterminated string interpolation")
        if depth != 0:
            raise JqSyntaxError("unbalanced brackets")

    def _string(self) -> None:
        """Lex a string literal, recursing into each \\( … ) interpolation as code."""
        text = self.text
        self.tokens.append(Token("str_start", '"', self.pos))
        self.pos += 1
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == '"':
                self.tokens.append(Token("str_end", '"', self.pos))
                self.pos += 1
                return
            if ch == "\\":
                if self.pos + 1 >= len(text):
                    break
                if text[self.pos + 1] == "(":
                    self.tokens.append(Token("interp_start", "\\(", self.pos))
                    self.pos += 2
                    self._code(interpolation=True)
                    self.tokens.append(Token("interp_end", ")", self.pos))
                    self.pos += 1
                    continue
                self.pos += 2
                continue
            self.pos += 1
        raise JqSyntaxError("unterminated string")


def tokenize(expr: str) -> list[Token]:
    """Lex a jq program into tokens; string bodies are skipped, interpolations lexed as code."""
    return _Lexer(expr).run()


@dataclass
class ScanResult:
    """What an expression calls and references, for the forbidden-function and variable checks."""

    calls: list[Token]
    references: list[Token]
    bindings: set[str]
    forbidden_keywords: list[Token]


def _is_opener(tok: Token) -> bool:
    """A token that opens a group: a bracket, a string, or an interpolation."""
    return tok.kind in ("str_start", "interp_start") or (tok.kind == "op" and tok.value in "([{")


def _is_closer(tok: Token) -> bool:
    """A token that closes a group opened by _is_opener."""
    return tok.kind in ("str_end", "interp_end") or (tok.kind == "op" and tok.value in ")]}")


def _skip_group(tokens: Sequence[Token], i: int) -> int:
    """Index just past the group opening at tokens[i] (nested strings and interpolations included)."""
    depth = 0
    while i < len(tokens):
        if _is_opener(tokens[i]):
            depth += 1
        elif _is_closer(tokens[i]):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _pattern(tokens: Sequence[Token], i: int, bindings: set[str], pattern_vars: set[int]) -> int:
    """Consume one destructuring pattern at tokens[i]; record the variables it binds."""
    if i >= len(tokens):
        return i
    tok = tokens[i]
    if tok.kind == "var":
        bindings.add(tok.value)
        pattern_vars.add(i)
        return i + 1
    if not (tok.kind == "op" and tok.value in "[{"):
        return i
    end = _skip_group(tokens, i)
    stack: list[Token] = []
    for j in range(i, end):
        t = tokens[j]
        # Only variables at pattern level bind; those inside (key expressions) or strings are references.
        if t.kind == "var" and all(s.kind == "op" and s.value in "[{" for s in stack):
            bindings.add(t.value)
            pattern_vars.add(j)
        if _is_opener(t):
            stack.append(t)
        elif _is_closer(t) and stack:
            stack.pop()
    return end


def scan(tokens: Sequence[Token]) -> ScanResult:
    """Classify identifiers (calls vs keys, def names, params) and variables (bindings vs references)."""
    calls: list[Token] = []
    references: list[Token] = []
    bindings: set[str] = set()
    forbidden_keywords: list[Token] = []
    pattern_vars: set[int] = set()
    not_calls: set[int] = set()
    label_vars: set[int] = set()

    # Pass 1: bindings ("as" patterns, def parameters, labels) and identifiers that are not calls.
    stack: list[str] = []  # open groups: "{", "[", "(", '"', "\\("
    key_position = False
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.kind == "keyword" and tok.value == "as":
            j = _pattern(tokens, i + 1, bindings, pattern_vars)
            # "?//" chains alternative patterns for the same value.
            while j < len(tokens) and tokens[j].kind == "op" and tokens[j].value == "?//":
                j = _pattern(tokens, j + 1, bindings, pattern_vars)
        elif tok.kind == "keyword" and tok.value == "def":
            if i + 1 < len(tokens) and tokens[i + 1].kind in ("ident", "keyword"):
                not_calls.add(i + 1)
                if i + 2 < len(tokens) and tokens[i + 2].kind == "op" and tokens[i + 2].value == "(":
                    end = _skip_group(tokens, i + 2)
                    for k in range(i + 3, end - 1):
                        if tokens[k].kind == "var":
                            bindings.add(tokens[k].value)
                            pattern_vars.add(k)
                        elif tokens[k].kind in ("ident", "keyword"):
                            not_calls.add(k)
        elif tok.kind == "keyword" and tok.value == "label":
            if i + 1 < len(tokens) and tokens[i + 1].kind == "var":
                label_vars.add(i + 1)
        elif tok.kind == "ident" and tok.value == "break":
            if i + 1 < len(tokens) and tokens[i + 1].kind == "var":
                # "break $name" names a label, which jq itself checks is in scope.
                not_calls.add(i)
                label_vars.add(i + 1)
        # Object-construction keys: an identifier or keyword right after "{" or a top-level "," in "{…}".
        if key_position and tok.kind in ("ident", "keyword"):
            not_calls.add(i)
        if _is_opener(tok):
            stack.append(tok.value)
        elif _is_closer(tok) and stack:
            stack.pop()
        key_position = tok.kind == "op" and (
            tok.value == "{" or (tok.value == "," and bool(stack) and stack[-1] == "{")
        )
        i += 1

    # Pass 2: every remaining identifier is a call; every unbound variable is a reference.
    for idx, tok in enumerate(tokens):
        if tok.kind == "keyword" and tok.value in FORBIDDEN_KEYWORDS:
            forbidden_keywords.append(tok)
        elif tok.kind == "ident" and idx not in not_calls:
            calls.append(tok)
        elif tok.kind == "var" and idx not in pattern_vars and idx not in label_vars:
            references.append(tok)
    return ScanResult(calls, references, bindings, forbidden_keywords)


def check_expression(expr: str) -> tuple[str, str] | None:
    """None when the expression is acceptable, else (code, detail): forbidden first, then compile."""
    try:
        tokens = tokenize(expr)
    except JqSyntaxError as exc:
        return "invalid_expression", f"expression does not parse: {exc}"
    result = scan(tokens)
    if result.forbidden_keywords:
        word = result.forbidden_keywords[0].value
        return "forbidden_function", f"{word} is not allowed (expressions have no module loader)"
    for tok in result.calls:
        if "::" in tok.value:
            return "forbidden_function", f"{tok.value} is a module function; modules are not allowed"
        if tok.value in FORBIDDEN_FUNCTIONS:
            return (
                "forbidden_function",
                f"{tok.value} is a forbidden function (it reads outside the envelope)",
            )
    for tok in result.references:
        if tok.value in FORBIDDEN_VARIABLES:
            return "forbidden_function", f"${tok.value} is forbidden (it reads outside the envelope)"
    for tok in result.references:
        if tok.value != PARAMS_VAR and tok.value not in result.bindings:
            return "invalid_expression", f"${tok.value} is not defined; $params is the only variable"
    if not expr.strip():
        return "invalid_expression", "expression is empty"
    try:
        # $params bound to an empty object defines it; every other free variable fails to compile.
        jq.compile(expr, args={PARAMS_VAR: {}})
    except ValueError as exc:
        return "invalid_expression", "expression does not compile: " + _jq_message(str(exc))
    try:
        # Evaluators wrap each rule in a larger program; a trailing "# …\" comment would swallow the
        # wrapper's closing text and turn the rule into a permanent compile_error (a silent no-match).
        jq.compile(f"(\n{expr}\n)", args={PARAMS_VAR: {}})
    except ValueError:
        return "invalid_expression", "expression must be self-contained (a trailing comment ends in a backslash?)"
    return None


def _jq_message(text: str) -> str:
    """The first line of a jq compile error, without its "jq: error: " prefix."""
    first = text.strip().splitlines()[0] if text.strip() else "compile error"
    return first.removeprefix("jq: error: ")


# ---------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------


def describe_rule(index: int, rule_id: str | None, rule_name: str | None) -> str:
    """`rule 2 (id "x", name "y")`: how every message names the offending rule."""
    parts = []
    if rule_id is not None:
        parts.append(f"id {json.dumps(rule_id, ensure_ascii=False)}")
    if rule_name is not None:
        parts.append(f"name {json.dumps(rule_name, ensure_ascii=False)}")
    return f"rule {index}" + (f" ({', '.join(parts)})" if parts else "")


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


def parse_action(action: Any) -> dict[str, Any]:
    """Check an action's shape (exactly one of queue or drop); raise ValueError with the reason."""
    if not isinstance(action, dict):
        raise ValueError("action must be an object")
    unknown = sorted(k for k in action if k not in ACTION_KEYS)
    if unknown:
        raise ValueError(f"action has unknown field(s): {', '.join(unknown)}")
    has_queue = "queue" in action
    has_drop = "drop" in action
    if has_queue == has_drop:
        raise ValueError('action must be exactly one of {"queue": …} or {"drop": true}')
    if has_drop:
        if action["drop"] is not True:
            raise ValueError('a drop action must be {"drop": true}')
        extra = sorted(k for k in action if k != "drop")
        if extra:
            raise ValueError(f"{', '.join(extra)} not allowed on a drop")
        return {"drop": True}
    queue = action["queue"]
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue must be a non-empty string")
    out: dict[str, Any] = {"queue": queue}
    if "endpoints" in action:
        endpoints = action["endpoints"]
        if not isinstance(endpoints, list) or not all(isinstance(e, str) and e for e in endpoints):
            raise ValueError("endpoints must be a list of endpoint ids")
        if not endpoints:
            raise ValueError("endpoints must name at least one endpoint; omit it to reach every target")
        if len(endpoints) > MAX_ENDPOINTS:
            raise ValueError(f"{len(endpoints)} endpoints; the limit is {MAX_ENDPOINTS}")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("endpoints must not repeat")
        out["endpoints"] = list(endpoints)
    for flag in QUEUE_FLAGS:
        if flag in action:
            if not isinstance(action[flag], bool):
                raise ValueError(f"{flag} must be true or false")
            out[flag] = action[flag]
    return out


def check_action_granted(action: Mapping[str, Any], grant: Grant) -> str | None:
    """None when a parsed action is reachable under the grant, else the reason it is not."""
    if action.get("drop") is True:
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
) -> dict[str, Any]:
    """One rule, in the order: shape, id, name, expression, action."""
    if not isinstance(rule, dict):
        raise _Where(f"rule {index}", index).error("invalid_rule", "a rule must be an object")
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
    problem = check_expression(expr)
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
    mint_id: Callable[[], str] = mint_rule_id,
) -> list[dict[str, Any]]:
    """Validate a whole routing configuration at save time; return the normalized rules or raise."""
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
    out = [_validate_rule(i, rule, grant, seen, mint_id, taken) for i, rule in enumerate(rules)]
    validate_default_action(default_action, grant)
    return out


def validate_config(
    rules: Any,
    default_action: Any,
    params: Any,
    grant: Grant,
    *,
    mint_id: Callable[[], str] = mint_rule_id,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, Any]]:
    """validate_rules plus the normalized default_action and params, ready to store together."""
    normalized = validate_rules(rules, default_action, params, grant, mint_id=mint_id)
    return normalized, validate_default_action(default_action, grant), validate_params(params)
