"""The jq sandbox child: evaluates one webhook's rule list per request and streams one result per rule.

Run as ``python -I routing/sandbox_child.py <memory_limit> <hard_deadline>`` with an empty environment.
This module imports nothing but the standard library and ``jq``, so a freshly executed child stays
small enough for an address-space cap to bound libjq (which aborts the process on allocation failure).

Protocol (one line each way, every child line starts with ``SBX1 ``):

* request: ``<header JSON> TAB <input JSON>`` where the header is ``{"seq", "start", "exprs"}`` and the
  input is ``[params, envelope]``, handed to jq as text so Python never parses the payload;
* replies: ``[0, "ready"]`` once at start-up, then per request ``[seq, "ack"]`` and one
  ``[seq, "r", rule_index, outcome, detail]`` per evaluated rule; the list ends at the first ``match``
  or after the last rule. Only indexes, outcomes and short fault details ever leave the child.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import OrderedDict
from typing import Any, Final, Literal

import jq

PREFIX: Final = b"SBX1 "

Outcome = Literal["match", "nomatch", "error", "compile_error"]

# Refused at save time too; refusing them here keeps evaluation pure even for rules stored earlier.
# libjq binds $ENV and $__loc__ itself, so they would otherwise compile.
REFUSED_VARIABLES: Final = frozenset({"ENV", "__loc__", "__prog_args", "__prog_name"})
REFUSED_FUNCTIONS: Final = frozenset(
    {
        "env",
        "input",
        "inputs",
        "input_filename",
        "input_line_number",
        "debug",
        "stderr",
        "halt",
        "halt_error",
        "now",
        "localtime",
        "strflocaltime",
        "get_search_list",
        "get_prog_origin",
        "get_jq_origin",
        "modulemeta",
        "import",
        "include",
    }
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*")
_DETAIL_MAX = 160
_LINE = re.compile(r"\bline (\d+)")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def refusal(expr: str) -> str | None:
    """Why an expression is refused before compiling (a forbidden variable or builtin), or None.

    A small lexer skips string literals (but scans their ``\\(...)`` interpolations, which are code)
    and comments; where it is unsure it scans more, never less.
    """
    _, why = _scan_code(expr, 0, inside_interpolation=False)
    return why


def _scan_code(expr: str, i: int, *, inside_interpolation: bool) -> tuple[int, str | None]:
    n, depth = len(expr), 0
    while i < n:
        c = expr[i]
        if c == '"':
            i, why = _scan_string(expr, i + 1)
            if why:
                return i, why
            continue
        if c == "#":
            while i < n and expr[i] != "\n":
                i += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0 and inside_interpolation:
                return i + 1, None
            depth -= 1
        elif c == "$":
            m = _IDENT.match(expr, i + 1)
            if m and m.group() in REFUSED_VARIABLES:
                return i, f"${m.group()} is not available to rules"
            i = m.end() if m else i + 1
            continue
        elif c.isascii() and (c.isalpha() or c == "_"):
            m = _IDENT.match(expr, i)
            assert m is not None
            name = m.group()
            after = expr[m.end() :].lstrip(" \t\r\n")
            is_field = i > 0 and expr[i - 1] in ".@"
            is_key = after.startswith(":") and not after.startswith("::")
            if name in REFUSED_FUNCTIONS and not is_field and not is_key:
                return i, f"{name} is not available to rules"
            i = m.end()
            continue
        i += 1
    return i, None


def _scan_string(expr: str, i: int) -> tuple[int, str | None]:
    """Index just past the string body starting at i, scanning interpolations as code."""
    n = len(expr)
    while i < n:
        c = expr[i]
        if c == "\\":
            if i + 1 < n and expr[i + 1] == "(":
                i, why = _scan_code(expr, i + 2, inside_interpolation=True)
                if why:
                    return i, why
                continue
            i += 2
            continue
        if c == '"':
            return i + 1, None
        i += 1
    return n, None


def short_detail(message: str) -> str:
    """A fault detail that fits a trace line and carries no quoted payload text."""
    first = message.strip().splitlines()[0] if message.strip() else "error"
    first = _QUOTED.sub('"…"', first)
    return first if len(first) <= _DETAIL_MAX else first[: _DETAIL_MAX - 1] + "…"


def wrap(expr: str) -> str:
    """The program actually compiled: $params bound from the input, truthiness decided inside jq."""
    return f".[0] as $params | .[1] | first((\n{expr}\n)) | (. != null and . != false)"


def input_text(params: dict[str, Any] | None, envelope_json: str) -> str:
    """The jq input for one event: params (None binds as {}) beside the already-encoded envelope."""
    return (
        "["
        + json.dumps(params if params is not None else {}, separators=(",", ":"))
        + ","
        + envelope_json
        + "]"
    )


class RuleEngine:
    """Compiles rules once (LRU by expression) and evaluates one rule against one input."""

    def __init__(self, cache_size: int = 1024) -> None:
        self._cache: OrderedDict[str, Any] = OrderedDict()  # compiled program, or the compile error text
        self._cache_size = cache_size

    def _program(self, expr: str) -> Any:
        hit = self._cache.get(expr)
        if hit is not None:
            self._cache.move_to_end(expr)
            return hit
        why = refusal(expr)
        entry: Any
        if why is not None:
            entry = why
        else:
            try:
                entry = jq.compile(wrap(expr))
            except ValueError as exc:
                # The wrapper puts the rule on line 2; report lines as the author wrote them.
                message = _LINE.sub(lambda m: f"line {int(m[1]) - 1}", str(exc).removeprefix("jq: error: "))
                entry = short_detail(message)
        self._cache[expr] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def run(self, expr: object, text: str) -> tuple[Outcome, str | None]:
        """Evaluate one rule: its outcome and, for a fault, a short detail."""
        if not isinstance(expr, str):
            return "compile_error", "expr is not a string"
        program = self._program(expr)
        if isinstance(program, str):
            return "compile_error", program
        try:
            first = next(iter(program.input_text(text)), None)
        except Exception as exc:  # libjq runtime errors arrive as ValueError; anything else is the rule's too
            return "error", short_detail(str(exc))
        return ("match" if first is True else "nomatch"), None


def _reply(*fields: object) -> bytes:
    return PREFIX + json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def _write(data: bytes) -> None:
    while data:
        data = data[os.write(1, data) :]


def serve(memory_limit: int, hard_deadline: float) -> None:
    """Answer requests on stdin until EOF; libjq runs with the address space capped."""
    import resource
    import signal

    engine = RuleEngine()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort must not spend time writing a core
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    if memory_limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    stdin = sys.stdin.buffer
    _write(_reply(0, "ready"))
    while True:
        line = stdin.readline()
        if not line:
            return
        head, _, body = line.partition(b"\t")
        request = json.loads(head)
        seq, start, exprs = int(request["seq"]), int(request["start"]), list(request["exprs"])
        text = body.decode()
        # A self-watchdog: SIGALRM's default action ends the child even inside libjq, even if the
        # parent is gone and can no longer kill it.
        signal.setitimer(signal.ITIMER_REAL, hard_deadline)
        _write(_reply(seq, "ack"))
        for offset, expr in enumerate(exprs):
            outcome, detail = engine.run(expr, text)
            _write(_reply(seq, "r", start + offset, outcome, detail))
            if outcome == "match":
                break
        signal.setitimer(signal.ITIMER_REAL, 0)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]))
