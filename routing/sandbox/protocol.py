"""The sandbox's wire protocol: what the parent (handle.py, pool.py) and the child (child_main.py) exchange.

This module imports nothing but the standard library: the child runs with ``python -I`` and loads it by
path (as it loads routing/jq_policy.py), so both sides frame, read and lay out the same bytes.

* request: one line. To evaluate it is ``<header JSON> TAB <exprs JSON> TAB <body> LF``: the header is
  ``{"seq", "base", "start"}`` (rule ``i`` of ``exprs`` is rule ``base + i`` of the webhook; evaluation
  begins at ``start``), ``exprs`` is the JSON list of the rules' expressions, and the body is the input
  ``[params, envelope]`` as compact UTF-8 JSON, handed to libjq as text so Python never parses the
  payload. A body of up to :data:`BODY_SLOT` bytes is not in the line at all: the parent copies it into the
  body slot of the shared memfd and the header says ``"len"`` (the field is then empty), which spares both
  sides copying it through the pipe. The child keys its compiled programs by the exprs field's bytes, so a
  list it has seen costs a dictionary lookup, not a JSON decode. ``{"seq", "warm": [exprs, ...]}`` compiles lists ahead of need, and
  ``{"seq", "check": exprs}`` (save-time validation) compiles each expression alone; both are the header
  alone. A request is written with one write and read with one read (the child reads with a large buffer).
* replies: lines starting with :data:`PREFIX`: ``[0, "ready"]`` once at start-up; per request one
  ``[seq, "r", rule_index, cause, detail]`` per faulted rule (a check: per expression that does not
  compile) and a final ``[seq, "end", matched_index_or_null]``. Rules without a line did not match. Only
  indexes, causes and short fault details ever leave the child.
* shared memory: one memfd (its number in the child's argv) holds the progress slot at offset 0, which the
  child maps read-write, and the body slot at :data:`BODY_OFFSET`, which it maps read-only (it can spoil
  nothing but its own next input; the parent never reads that slot back).
* progress: the slot (:data:`PROGRESS`) the child writes before each rule, so the parent can time the
  running rule without a pipe write and wake-up per rule. The rule's start on the child's CPU clock (and on the
  wall clock) is read afresh when :data:`CPU_REFRESH_NS` of wall-clock time have passed since the last reading,
  and is that last reading otherwise, when the child writes the new index alone (:data:`INDEX` at
  :data:`INDEX_OFFSET`): an early bound (CPU time cannot outrun the wall clock), so a rule is charged at most
  that much CPU of the rules before it and is never given more than its timeout. A clock reading is a system
  call; most rules take microseconds.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from typing import Any, Final, Literal

PREFIX: Final = b"SBX1 "
READY: Final = PREFIX + b'[0,"ready"]'
# The progress slot: request seq, the running rule's index (COMPILING while the rule list compiles, PARSING
# while libjq parses the event), when that rule started and when the rules' clock started (moved on by
# every parse, so that now minus it is time spent in rules), each on the wall clock (CLOCK_MONOTONIC ns)
# and on the child's CPU clock (CLOCK_PROCESS_CPUTIME_ID ns: the clock the parent reads as the child
# process's CPU clock, so the two compare without translation).
PROGRESS: Final = struct.Struct("<qqqqqq")
INDEX: Final = struct.Struct("<q")  # the running rule's index alone, written in place (one aligned 8-byte store)
INDEX_OFFSET: Final = 8
COMPILING: Final = -1
PARSING: Final = -2
BODY_OFFSET: Final = max(mmap.ALLOCATIONGRANULARITY, 4096)  # mappings start on a page boundary
BODY_SLOT: Final = 2 * 1024 * 1024  # bodies up to this size travel in shared memory, larger ones in the line
SHARED_SIZE: Final = BODY_OFFSET + BODY_SLOT
CPU_REFRESH_NS: Final = 500_000  # see "progress" above: at most 0.5 ms of earlier rules' CPU charged to a rule
FAULT_CAUSES: Final = frozenset({"error", "compile_error"})
DETAIL_MAX: Final = 200  # the longest fault detail the parent keeps, whatever a child sends

_COMPACT: Final = (",", ":")


def input_text(params: dict[str, Any] | None, envelope_json: str) -> str:
    """The jq input for one event: params (None binds as {}) beside the already-encoded envelope."""
    params_json = json.dumps(params if params is not None else {}, separators=_COMPACT)
    return "[" + params_json + "," + envelope_json + "]"


def encode_input(params: dict[str, Any] | None, envelope: dict[str, Any]) -> bytes:
    """The child's input line body: compact UTF-8 JSON, about a third of the ASCII-escaped size to parse."""
    # Python ints of any size encode exactly and libjq keeps integer literals, so >2^53 ids compare right.
    text = input_text(params, json.dumps(envelope, separators=_COMPACT, ensure_ascii=False, allow_nan=False))
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate (the receiver should never let one through): libjq refuses its \ud800 escape as
        # well, and a parse failure would fault every rule, so it becomes U+FFFD; a paired one is rejoined.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode()


def _header(header: dict[str, object]) -> bytes:
    return json.dumps(header, separators=_COMPACT).encode()


def encode_exprs(exprs: list[object]) -> bytes:
    """A rule list's exprs field (the child's plan-cache key: the same list must encode to the same bytes)."""
    return json.dumps(exprs, separators=_COMPACT).encode()


def evaluate_request(seq: int, *, base: int, start: int, exprs: bytes, body: bytes, shared: bool = False) -> bytes:
    """Evaluate ``exprs`` (from :func:`encode_exprs`; rules ``base``.. of the webhook) from ``start`` over ``body``.

    ``shared``: the body is in the body slot (the sender put it there), and the line only says how long it is.
    """
    # The header holds only ints: formatted directly, the same JSON json.dumps would write, in a fraction of it.
    if shared:
        head = b'{"seq":%d,"base":%d,"start":%d,"len":%d}\t' % (seq, base, start, len(body))
        return b"".join((head, exprs, b"\t\n"))
    return b"".join((b'{"seq":%d,"base":%d,"start":%d}\t' % (seq, base, start), exprs, b"\t", body, b"\n"))


def warm_request(seq: int, rule_lists: list[list[object]]) -> bytes:
    """Compile these rule lists ahead of need (a freshly started spare)."""
    return _header({"seq": seq, "warm": rule_lists}) + b"\n"


def check_request(seq: int, exprs: list[str]) -> bytes:
    """Compile each expression alone, as a save-time check."""
    return _header({"seq": seq, "check": exprs}) + b"\n"


def read_request(line: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """A request line's header, exprs field and body (the child's side of the three requests above).

    Warm and check requests have neither an exprs field nor a body (both empty).
    """
    head, _, rest = line.rstrip(b"\n").partition(b"\t")
    header: dict[str, Any] = json.loads(head)
    exprs, _, body = rest.partition(b"\t")
    return header, exprs, body


def reply(*fields: object) -> bytes:
    """One reply line (the child's side of :func:`parse_reply`)."""
    return PREFIX + json.dumps(fields, separators=_COMPACT).encode() + b"\n"


class ProtocolViolation(Exception):
    """A child line carried the protocol prefix but not a reply the parent asked for."""


@dataclass(frozen=True)
class Reply:
    """One parsed child reply: a faulted rule, or the end of the request with the matching rule if any."""

    kind: Literal["fault", "end"]
    rule_index: int | None = None
    cause: str = ""
    detail: str | None = None


_NO_MATCH: Final = Reply(kind="end")


def parse_reply(line: bytes, *, seq: int, expected_index: int, rule_count: int) -> Reply | None:
    """Parse one child line for request ``seq``; None means ignore it, ProtocolViolation means fail closed.

    Lines without the prefix and replies to other requests are ignored. A prefixed reply naming a rule
    outside ``[expected_index, rule_count)`` (e.g. a forged match) is a violation: the parent then
    records no match and a sandbox_failure.
    """
    if not line.startswith(PREFIX):
        return None
    # The usual line, as the child writes it (reply() is compact): no JSON decode. Anything else takes the path below.
    end = b'%s[%d,"end",' % (PREFIX, seq)
    if line.startswith(end) and line.endswith(b"]"):
        value = line[len(end) : -1]
        if value == b"null":
            return _NO_MATCH
        if (value.isdigit() and value[:1] != b"0") or value == b"0":
            index = int(value)
            if not expected_index <= index < rule_count:
                raise ProtocolViolation(f"matched index {index!r} out of range")
            return Reply(kind="end", rule_index=index)
    try:
        fields = json.loads(line[len(PREFIX) :])
    except ValueError as exc:
        raise ProtocolViolation("unparseable reply") from exc
    if not isinstance(fields, list) or len(fields) < 2 or type(fields[0]) is not int:
        raise ProtocolViolation("malformed reply")
    if fields[0] != seq:
        return None
    if fields[1] == "end" and len(fields) == 3:
        index = fields[2]
        if index is not None and (type(index) is not int or not expected_index <= index < rule_count):
            raise ProtocolViolation(f"matched index {index!r} out of range")
        return Reply(kind="end", rule_index=index)
    if fields[1] != "r" or len(fields) != 5:
        raise ProtocolViolation("malformed reply")
    _, _, index, cause, detail = fields
    if type(index) is not int or not expected_index <= index < rule_count:
        raise ProtocolViolation(f"rule index {index!r} out of range")
    if cause not in FAULT_CAUSES or not (detail is None or isinstance(detail, str)):
        raise ProtocolViolation("malformed fault")
    return Reply(kind="fault", rule_index=index, cause=cause, detail=detail and detail[:DETAIL_MAX])
