"""The jq sandbox: first-match-wins evaluation in warm, capped, killable child processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import jq
import pytest

from routing.models import Evaluation
from routing.sandbox import ProtocolViolation, Reply, SandboxPool, child_main, encode_input, jq_bytes, parse_reply
from routing.sandbox.child_main import FD_LIMIT, _RulesClock
from routing.sandbox.engine import PARSED, RuleEngine, _Plan, program_input, refusal
from routing.sandbox.protocol import BODY_SLOT, CPU_REFRESH_NS, PARSING, PROGRESS
from tests.routing.in_process import evaluate_in_process
from tests.routing.jq_reference import decided, reference_evaluate

ENVELOPE: dict[str, Any] = {
    "source": "github",
    "kind": "issues.opened",
    "verified": True,
    "payload": {"issue": {"id": 9_007_199_254_740_993, "number": 7}, "n": 200_000_000},
    "issue": {"author": "mallory", "labels": ["bug"], "title": "it breaks"},
}

RUNAWAYS = [
    "def f: f; f",
    "[repeat(1)] | length",
    "[range(1e9)] | length",
    '[limit(1e8; repeat("x"*1000))] | length',
    "last(range(1e12))",
]


def rules(*exprs: str) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", "expr": e, "action": {"queue": "q"}} for i, e in enumerate(exprs)]


def causes(result: Evaluation) -> list[tuple[int, str]]:
    return [(f.rule_index, f.cause) for f in result.faults]


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    sandbox = SandboxPool()
    yield sandbox
    await sandbox.close()


async def test_first_match_wins(pool: SandboxPool) -> None:
    result = await pool.evaluate(rules(".verified", '.source == "github"'), None, ENVELOPE)
    assert result == Evaluation(matched_index=0)


async def test_rules_after_a_match_are_not_evaluated(pool: SandboxPool) -> None:
    result = await pool.evaluate(rules("false", "true", 'error("must not run")'), None, ENVELOPE)
    assert result == Evaluation(matched_index=1)


@pytest.mark.parametrize("expr", ["0", '""', "[]", "{}", "1, false", ".issue.labels"])
async def test_truthy_first_output_matches(pool: SandboxPool, expr: str) -> None:
    assert (await pool.evaluate(rules(expr), None, ENVELOPE)).matched_index == 0


@pytest.mark.parametrize("expr", ["false", "null", "empty", "false, true", ".missing", "select(false)"])
async def test_false_null_or_no_output_does_not_match(pool: SandboxPool, expr: str) -> None:
    assert await pool.evaluate(rules(expr), None, ENVELOPE) == Evaluation()


async def test_params_are_bound(pool: SandboxPool) -> None:
    check = ".issue.author as $a | ($params.trusted_humans | arrays | index($a)) != null"
    trusted = await pool.evaluate(rules(check), {"trusted_humans": ["mallory"]}, ENVELOPE)
    assert trusted == Evaluation(matched_index=0)
    assert await pool.evaluate(rules(check), {"trusted_humans": "mallory"}, ENVELOPE) == Evaluation()


async def test_missing_params_bind_as_empty_object_and_fail_closed(pool: SandboxPool) -> None:
    check = ".issue.author as $a | ($params.trusted_humans | arrays | index($a)) != null"
    assert await pool.evaluate(rules("$params == {}"), None, ENVELOPE) == Evaluation(matched_index=0)
    assert await pool.evaluate(rules(check), None, ENVELOPE) == Evaluation()


@pytest.mark.parametrize(
    "expr", ["$ENV", "$ENV.PATH", "env.HOME", "$__loc__", "$undefined", "now > 0", "input", '"\\(env)"', ".a | ("]
)
async def test_forbidden_or_broken_expressions_are_compile_errors(pool: SandboxPool, expr: str) -> None:
    result = await pool.evaluate(rules(expr, "true"), None, ENVELOPE)
    assert result.matched_index == 1
    assert causes(result) == [(0, "compile_error")]
    assert result.faults[0].rule_id == "r0" and result.faults[0].detail


@pytest.mark.parametrize("expr", ['.name == "env"', ".env", "{env: 1} | .env == 1", "# env\ntrue", '"$ENV" | length'])
def test_refusal_reads_strings_fields_keys_and_comments_as_data(expr: str) -> None:
    assert refusal(expr) is None


async def test_runtime_error_is_a_fault_and_evaluation_continues(pool: SandboxPool) -> None:
    result = await pool.evaluate(rules(".payload.issue.number | .x", 'error("boom")', "true"), None, ENVELOPE)
    assert result.matched_index == 2
    assert causes(result) == [(0, "error"), (1, "error")]
    assert result.faults[1].detail == "boom"
    assert "Cannot index" in (result.faults[0].detail or "")


async def test_integers_beyond_2_53_compare_exactly(pool: SandboxPool) -> None:
    result = await pool.evaluate(rules(".payload.issue.id == 9007199254740993"), None, ENVELOPE)
    assert result == Evaluation(matched_index=0)


@pytest.mark.parametrize("runaway", RUNAWAYS)
async def test_runaway_rule_is_killed_and_the_next_rule_decides(pool: SandboxPool, runaway: str) -> None:
    started = time.perf_counter()
    result = await pool.evaluate(rules(runaway, ".verified"), None, ENVELOPE)
    elapsed = time.perf_counter() - started
    assert result.matched_index == 1
    assert causes(result) == [(0, "timeout")]
    # The 50 ms budget is CPU time; on a loaded machine the wall clock runs longer, up to the per-rule safety
    # bound (20x the timeout). What must hold is that the runaway never waits out the 2 s hard deadline.
    assert elapsed < 1.5


@pytest.mark.parametrize(
    "bomb",
    [
        '"x" * 200000000 | length > 0',  # folded at compile time: the child dies before any rule runs
        '"x" * .payload.n | length > 0',  # allocated at run time
    ],
)
async def test_memory_bomb_hits_the_cap_and_the_next_rule_decides(pool: SandboxPool, bomb: str) -> None:
    result = await pool.evaluate(rules("false", bomb, ".verified"), None, ENVELOPE)
    assert result.matched_index == 2
    assert causes(result) == [(1, "error")]
    assert "died" in (result.faults[0].detail or "")


async def test_event_budget_exhaustion_is_recorded_per_rule() -> None:
    sandbox = SandboxPool(rule_timeout=0.05, event_budget=0.08)
    try:
        result = await sandbox.evaluate(rules("def f: f; f", "last(range(1e12))", "true", "true"), None, ENVELOPE)
    finally:
        await sandbox.close()
    assert result.matched_index is None
    assert causes(result) == [(0, "timeout"), (1, "budget_exhausted"), (2, "budget_exhausted"), (3, "budget_exhausted")]


async def test_a_delivery_without_a_slot_gets_sandbox_busy() -> None:
    # The holder needs only to outlast the busy attempt; a small CPU budget keeps it a timeout (not the 2 s hard
    # deadline's sandbox_failure) even when a loaded machine gives the child little CPU.
    sandbox = SandboxPool(max_children=1, rule_timeout=0.2, event_budget=0.4, acquire_timeout=0.02)
    try:
        holder = asyncio.create_task(sandbox.evaluate(rules("def f: f; f"), None, ENVELOPE))
        await asyncio.sleep(0.05)
        busy = await sandbox.evaluate(rules("true"), None, ENVELOPE)
        assert busy.matched_index is None
        assert causes(busy) == [(-1, "sandbox_busy")]
        assert causes(await holder) == [(0, "timeout")]
    finally:
        await sandbox.close()


def test_parse_reply_ignores_unprefixed_lines_and_other_requests() -> None:
    assert parse_reply(b'[3,"end",0]', seq=3, expected_index=0, rule_count=2) is None
    assert parse_reply(b"noise SBX1 [3]", seq=3, expected_index=0, rule_count=2) is None
    assert parse_reply(b'SBX1 [2,"end",0]', seq=3, expected_index=0, rule_count=2) is None
    assert parse_reply(b'SBX1 [3,"end",1]', seq=3, expected_index=0, rule_count=2) == Reply(kind="end", rule_index=1)
    assert parse_reply(b'SBX1 [3,"end",null]', seq=3, expected_index=0, rule_count=2) == Reply(kind="end")
    fault = parse_reply(b'SBX1 [3,"r",0,"error","boom"]', seq=3, expected_index=0, rule_count=2)
    assert fault == Reply(kind="fault", rule_index=0, cause="error", detail="boom")


@pytest.mark.parametrize(
    "line",
    [
        b'SBX1 [3,"end",2]',  # past the last rule
        b'SBX1 [3,"end",-1]',
        b'SBX1 [3,"end",0]',  # before the first rule this request evaluates
        b'SBX1 [3,"end",true]',
        b'SBX1 [3,"r",5,"error","x"]',
        b'SBX1 [3,"r",1,"match",null]',
        b"SBX1 {not json",
    ],
)
def test_parse_reply_refuses_out_of_range_or_malformed_replies(line: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_reply(line, seq=3, expected_index=1, rule_count=2)


@pytest.mark.parametrize(
    "tail",
    [b"0]", b"1]", b"null]", b"01]", b" 1]", b"1 ]", b"1.0]", b"-0]", b"1e0]", b"2]", b"\xd9\xa1]", b"1", b"1]]"],
)
def test_the_end_reply_s_fast_path_reads_what_the_json_path_reads(tail: bytes) -> None:
    """The usual end line skips the JSON decode; any line reads the same as decoding it would (or fails closed)."""
    line = b'SBX1 [3,"end",' + tail

    def read(parse: Callable[[bytes], object]) -> object:
        try:
            return parse(line)
        except ProtocolViolation as exc:
            return ("violation", str(exc).split(" ")[0])

    def by_json(raw: bytes) -> object:  # the same line, spaced so the fast path cannot take it
        return parse_reply(raw.replace(b'"end",', b'"end", '), seq=3, expected_index=0, rule_count=2)

    assert read(lambda raw: parse_reply(raw, seq=3, expected_index=0, rule_count=2)) == read(by_json)


FAKE_CHILD = r"""
import json, sys
out = sys.stdout.buffer
out.write(b"hello from a compromised child\nSBX1 [0,\"ready\"]\n"); out.flush()
for line in sys.stdin.buffer:
    seq = json.loads(line.partition(b"\t")[0])["seq"]
    out.write(b"garbage\nSBX1 [%d,\"end\",99]\n" % seq); out.flush()
"""


async def test_a_forged_out_of_range_match_is_ignored_and_fails_closed() -> None:
    sandbox = SandboxPool()
    sandbox._argv = [sys.executable, "-I", "-c", FAKE_CHILD]  # the progress fd is appended as argv[1]
    try:
        result = await sandbox.evaluate(rules("true", "true"), None, ENVELOPE)
    finally:
        await sandbox.close()
    assert result.matched_index is None
    assert causes(result) == [(-1, "sandbox_failure")]


async def test_no_child_is_started_for_an_empty_rule_list() -> None:
    sandbox = SandboxPool()
    assert await sandbox.evaluate([], {"x": 1}, ENVELOPE) == Evaluation()
    assert sandbox.child_pids() == []
    await sandbox.close()


async def test_child_environment_is_empty(pool: SandboxPool) -> None:
    os.environ["SWITCHBOARD_TEST_SECRET"] = "do-not-leak"
    try:
        await pool.evaluate(rules("true"), None, ENVELOPE)
        pids = pool.child_pids()
        assert pids
        for pid in pids:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                assert environ.read() == b""
    finally:
        del os.environ["SWITCHBOARD_TEST_SECRET"]


RULE_LISTS = [
    rules(".verified"),
    rules("false", "null", '.kind | startswith("issues")'),
    rules("$ENV", ".x.y | .z", "empty", '.issue.labels | index("bug") != null'),
    rules('.issue.title | test("BREAK"; "i") | not', "$params.q == 1", "1"),
    rules('error({"a": 1})', '[.issue.labels[] | ascii_upcase] == ["BUG"]'),
    rules("$params.trusted_humans | arrays | length > 0", "false"),
]


@pytest.mark.parametrize("rule_list", RULE_LISTS)
async def test_sandbox_agrees_with_libjq_rule_by_rule(pool: SandboxPool, rule_list: list[dict[str, Any]]) -> None:
    for params in (None, {"q": 1, "trusted_humans": ["a"]}):
        expected = decided(reference_evaluate(rule_list, params, ENVELOPE))
        assert decided(await pool.evaluate(rule_list, params, ENVELOPE)) == expected
        assert decided(evaluate_in_process(rule_list, params, ENVELOPE)) == expected


async def test_evaluation_is_deterministic(pool: SandboxPool) -> None:
    rule_list = rules("def f: f; f", '.issue.author == "mallory"')
    first = await pool.evaluate(rule_list, None, ENVELOPE)
    assert all([await pool.evaluate(rule_list, None, ENVELOPE) == first for _ in range(3)])


async def test_close_leaves_no_child_processes() -> None:
    sandbox = SandboxPool()
    await sandbox.evaluate(rules("def f: f; f", "true"), None, ENVELOPE)  # one child killed, one replaced
    pids = sandbox.child_pids()
    assert pids
    await sandbox.close()
    assert sandbox.child_pids() == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")  # killed and reaped: not even a zombie
    assert causes(await sandbox.evaluate(rules("true"), None, ENVELOPE)) == [(-1, "sandbox_failure")]


# A closed issue whose body is about 1 MiB of 4-byte characters: the parse dwarfs the one-field rule.
BIG_ENVELOPE: dict[str, Any] = {
    "source": "github",
    "kind": "issues.closed",
    "verified": True,
    "payload": {"issue": {"state": "closed", "body": "😀" * 262_000}},
    "issue": {"state": "closed"},
}
CLOSED = '.issue.state == "closed"'


def parse_seconds(envelope: dict[str, Any]) -> float:
    """How long libjq takes to parse the child's input for this envelope (the best of three)."""
    text = encode_input(None, envelope).decode()[:-1] + ",0]"  # the same text the child hands libjq
    program = jq.compile("0")
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        program.input_text(text).first()
        best = min(best, time.perf_counter() - started)
    return best


def test_the_envelope_travels_as_compact_utf8_json() -> None:
    encoded = encode_input({"k": 1}, {"t": "😀", "n": 2**64})
    assert encoded == '[{"k":1},{"t":"😀","n":18446744073709551616}]'.encode()
    assert len(encode_input(None, BIG_ENVELOPE)) < 1.01 * 1024 * 1024


def test_jq_py_reads_the_input_through_encode_so_the_child_hands_it_the_body_s_bytes() -> None:
    # The behaviour routing/sandbox/jq_bytes.py relies on, on the installed jq.py: input_text asks its argument
    # for its UTF-8 through encode(), so the body's bytes reach libjq without a decode.
    assert jq_bytes.BYTES_INPUT
    body = encode_input({"k": "é"}, {"t": "😀", "n": 2**64})
    handed = program_input(memoryview(body), 2)  # from the shared body slot, as the child reads it
    assert handed.encode() == b'[{"k":"\\u00e9"},{"t":"\xf0\x9f\x98\x80","n":18446744073709551616},2]'
    assert jq.compile(".").input_text(handed).first() == [{"k": "é"}, {"t": "😀", "n": 2**64}, 2]
    engine = RuleEngine()
    exprs: list[object] = ['$params.k == "é" and .t == "x"', '.t == "😀" and .n == 18446744073709551616']
    outcomes = list(engine.evaluate(engine.prepare(exprs), exprs, memoryview(body)))
    assert outcomes == [(0, "nomatch", None), (1, "match", None)]
    assert list(engine.evaluate(engine.prepare(exprs), exprs, body, 1)) == [(1, "match", None)]


@pytest.mark.parametrize("undecoded", [True, False])
def test_both_input_paths_read_a_body_alike(monkeypatch: pytest.MonkeyPatch, undecoded: bool) -> None:
    # Were jq.py ever to stop reading through encode(), the body is decoded instead (the public path), with the
    # same outcomes, down to bytes that are not UTF-8 (read as U+FFFD, as libjq reads them).
    monkeypatch.setattr(jq_bytes, "BYTES_INPUT", undecoded)
    body = encode_input(None, {"t": "😀", "n": 2**64})[:-2] + b',"bad":"a\xffb"}]'
    assert isinstance(program_input(body, 0), jq_bytes.Utf8Text) is undecoded
    engine = RuleEngine()
    exprs: list[object] = ['.t == "x"', '.bad == "a\ufffdb" and .t == "😀" and .n == 18446744073709551616']
    assert list(engine.evaluate(engine.prepare(exprs), exprs, body)) == [(0, "nomatch", None), (1, "match", None)]


async def test_a_lone_surrogate_still_evaluates_as_the_replacement_character(pool: SandboxPool) -> None:
    envelope = {"payload": {"t": "a\ud800b", "pair": "\ud83d\ude00"}}
    rule_list = rules('.payload.t == "a\\ufffdb" and .payload.pair == "😀"')
    assert await pool.evaluate(rule_list, None, envelope) == Evaluation(matched_index=0)
    assert evaluate_in_process(rule_list, None, envelope) == Evaluation(matched_index=0)


async def test_the_parse_of_a_1_mib_envelope_is_not_charged_to_the_first_rule(pool: SandboxPool) -> None:
    # At the production limits (50 ms per rule, 250 ms per event), on a loaded machine, 20 times in a row.
    for _ in range(20):
        assert await pool.evaluate(rules(CLOSED), None, BIG_ENVELOPE) == Evaluation(matched_index=0)
        assert evaluate_in_process(rules(CLOSED), None, BIG_ENVELOPE) == Evaluation(matched_index=0)


# Four times the body cap, so the parse outlasts a reduced rule timeout several times over and a scheduling
# hiccup of a loaded machine (which can pause a child for ten milliseconds and more) does not decide.
HUGE_ENVELOPE: dict[str, Any] = {**BIG_ENVELOPE, "payload": {"issue": {"state": "closed", "body": "😀" * 1_048_000}}}
REDUCED_TIMEOUT = 0.03
SLACK_DEADLINE = 10.0  # not what these tests are about: a starved machine may spawn the spare slowly


def reduced_timeout(parse: float) -> float:
    """The reduced rule timeout: 30 ms, or a third of the parse on a machine that parses faster than 90 ms.

    The clocks count the child's CPU time, so a scheduling pause does not spend them; what the tests need is a
    parse that outlasts the timeout with room to spare, whatever the machine's speed (one parsed in 56 ms).
    """
    return min(REDUCED_TIMEOUT, parse / 3)


async def test_with_a_reduced_rule_timeout_the_parse_still_belongs_to_no_rule() -> None:
    # Without this the test would prove nothing: the parse alone outlasts the rule's whole timeout.
    parse = parse_seconds(HUGE_ENVELOPE)
    timeout = reduced_timeout(parse)
    assert parse > 2 * timeout
    sandbox = SandboxPool(rule_timeout=timeout, event_budget=timeout, hard_deadline=SLACK_DEADLINE)
    try:
        for _ in range(5):
            assert await sandbox.evaluate(rules(CLOSED), None, HUGE_ENVELOPE) == Evaluation(matched_index=0)
    finally:
        await sandbox.close()
    for _ in range(5):
        result = evaluate_in_process(rules(CLOSED), None, HUGE_ENVELOPE, rule_timeout=timeout)
        assert result == Evaluation(matched_index=0)


async def test_a_list_resumed_on_the_spare_after_a_kill_does_not_pay_the_parse() -> None:
    parse = parse_seconds(HUGE_ENVELOPE)
    timeout = reduced_timeout(parse)
    assert parse > 2 * timeout
    # Rule 0 spends the timeout, then the spare parses the event again: were either parse charged, the
    # budget (rule 0's timeout and most of one parse) would be spent before rule 2 ran.
    sandbox = SandboxPool(rule_timeout=timeout, event_budget=timeout + 0.9 * parse, hard_deadline=SLACK_DEADLINE)
    try:
        for _ in range(3):
            result = await sandbox.evaluate(rules("def f: f; f", "false", CLOSED), None, HUGE_ENVELOPE)
            assert result.matched_index == 2, result
            assert causes(result) == [(0, "timeout")]
    finally:
        await sandbox.close()


class _UncaughtOnce:
    """A compiled program whose first run raises past every try/catch after the parse (libjq can do so)."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    def input_text(self, text: str) -> Iterator[object]:
        start = int(text.encode().rsplit(b",", 1)[1].rstrip(b"]"))
        self.runs.append(start)
        yield PARSED
        if len(self.runs) == 1:
            raise ValueError("uncaught")
        yield [start, "match"]


def test_a_re_parse_after_an_uncaught_error_is_reported_so_no_rule_pays_for_it() -> None:
    program = _UncaughtOnce()
    engine = RuleEngine()
    calls: list[tuple[str, int]] = []
    outcomes = list(
        engine.evaluate(
            _Plan(program, {}),
            ["x", "y"],
            b"[{},{}]",
            parsing=lambda position: calls.append(("parsing", position)),
            parsed=lambda position: calls.append(("parsed", position)),
        )
    )
    assert outcomes == [(0, "error", "uncaught"), (1, "match", None)]
    assert program.runs == [0, 1]
    assert calls == [("parsing", 0), ("parsed", 0), ("parsing", 1), ("parsed", 1)]


def test_the_rules_clock_moves_on_by_every_parse() -> None:
    slot = bytearray(PROGRESS.size)
    clock = _RulesClock(slot, 7, 3)
    clock.parsing(0)
    assert PROGRESS.unpack_from(slot)[:2] == (7, PARSING)
    paused = time.monotonic_ns()
    while time.monotonic_ns() - paused < 30_000_000:  # a 30 ms "parse" (busy: it costs CPU time too)
        pass
    clock.parsed(0)
    seq, index, rule_ns, began_ns, rule_cpu, began_cpu = PROGRESS.unpack_from(slot)
    assert (seq, index) == (7, 3)
    assert rule_ns - began_ns < 30_000_000  # the rules' clock did not run during the parse
    assert 0 <= rule_cpu - began_cpu < 20_000_000  # nor did the rules' CPU clock, which the parse kept busy
    assert rule_cpu <= time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)  # the clock the parent reads
    clock.rule_started(1)
    fields = PROGRESS.unpack_from(slot)
    assert fields[1] == 4 and fields[3] == began_ns and fields[5] == began_cpu


def test_a_rule_s_cpu_start_is_never_later_than_its_true_start() -> None:
    slot = bytearray(PROGRESS.size)
    clock = _RulesClock(slot, 7, 0)
    clock.parsing(0)
    clock.parsed(0)
    read_at_parse = PROGRESS.unpack_from(slot)[4]
    clock.rule_started(1)  # at once: within CPU_REFRESH_NS, the last reading stands in (an early bound)
    assert PROGRESS.unpack_from(slot)[1:5:3] == (1, read_at_parse)
    paused = time.monotonic_ns()
    while time.monotonic_ns() - paused < 3 * CPU_REFRESH_NS:  # a rule busy past the refresh interval
        pass
    before = time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)
    clock.rule_started(2)  # read afresh: the busy rule's CPU is not charged to rule 2
    index, rule_cpu = PROGRESS.unpack_from(slot)[1:5:3]
    assert index == 2 and before <= rule_cpu <= time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)


async def test_bodies_in_the_shared_slot_and_beyond_it_evaluate_alike(pool: SandboxPool) -> None:
    for filler in (BODY_SLOT // 2, BODY_SLOT + 1024):  # in the child's body slot, and sent in the line
        envelope = {**ENVELOPE, "pad": "x" * filler}
        assert (len(encode_input(None, envelope)) <= BODY_SLOT) == (filler < BODY_SLOT)
        rule_list = rules(".pad | length < 10", f".pad | length == {filler}", "true")
        assert await pool.evaluate(rule_list, None, envelope) == Evaluation(matched_index=1)
        assert evaluate_in_process(rule_list, None, envelope) == Evaluation(matched_index=1)
    # A smaller body after a larger one: the slot's stale tail is never read.
    assert await pool.evaluate(rules('.kind == "issues.opened"'), None, ENVELOPE) == Evaluation(matched_index=0)


def _proc_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as status:
        return dict(line.split(":\t", 1) for line in status.read().splitlines() if ":\t" in line)


def _limits(pid: int) -> dict[str, tuple[str, str]]:
    with open(f"/proc/{pid}/limits") as limits:
        rows = limits.read().splitlines()[1:]
    return {row[:26].strip(): (row[26:47].strip(), row[47:68].strip()) for row in rows}


async def test_children_are_hardened_before_they_read_a_request(pool: SandboxPool) -> None:
    await pool.evaluate(rules("true"), None, ENVELOPE)
    deadline = time.monotonic() + 20
    while True:  # the spare may still be starting: poll until every child has hardened itself
        pids = pool.child_pids()
        if pids and all(_proc_fields(pid).get("NoNewPrivs", "").strip() == "1" for pid in pids):
            break
        assert time.monotonic() < deadline, [_proc_fields(pid) for pid in pids]
        await asyncio.sleep(0.05)
    for pid in pids:
        fields = _proc_fields(pid)
        assert fields["Seccomp"].strip() == "2" and fields["Seccomp_filters"].strip() == "1"
        limits = _limits(pid)
        assert limits["Max open files"] == (str(FD_LIMIT), str(FD_LIMIT))
        assert limits["Max processes"] == ("0", "0")
        assert limits["Max core file size"] == ("0", "0") and limits["Max file size"] == ("0", "0")
        assert sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]  # not even the progress memfd
    # And jq still works under all of it.
    assert await pool.evaluate(rules(CLOSED), None, BIG_ENVELOPE) == Evaluation(matched_index=0)


HARDENED_PROBE = r"""
import os, subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from child_main import harden
harden()
results = {}
for name, attempt in [
    ("fork", os.fork),
    ("posix_spawn", lambda: os.posix_spawn("/bin/true", ["true"], {})),
    ("execv", lambda: os.execv("/bin/true", ["true"])),
    ("subprocess", lambda: subprocess.run(["/bin/true"])),
]:
    try:
        attempt()
        results[name] = "started"
    except OSError as exc:
        results[name] = exc.errno
thread = threading.Thread(target=lambda: results.__setitem__("thread", "ran"))
thread.start()
thread.join()
print(sorted(results.items()), flush=True)
"""


def test_the_child_loads_only_its_engine_and_the_modules_the_engine_and_the_wire_format_need() -> None:
    """Run as the pool runs it (by path, under -I), the child imports nothing of ours beyond its four modules."""
    import subprocess

    code = (
        "import runpy, sys\n"
        "import jq\n"  # and whatever libjq's binding brings along
        "before = set(sys.modules)\n"
        f"runpy.run_path({child_main.__file__!r}, run_name='sandbox_child')\n"  # not __main__: it does not serve
        "new = set(sys.modules) - before\n"
        "print(sorted(n for n in new if n.split('.')[0] not in sys.stdlib_module_names))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, text=True, env={})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [
            "routing",
            "routing.jq_policy",
            "routing.sandbox",
            "routing.sandbox.engine",
            "routing.sandbox.jq_bytes",
            "routing.sandbox.protocol",
        ]
    )


def test_a_hardened_child_cannot_start_a_program_but_threads_still_work() -> None:
    import errno
    import subprocess

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the seccomp filter covers x86_64 and aarch64 only")
    sandbox_dir = os.path.dirname(os.path.abspath(child_main.__file__))
    probe = subprocess.run(
        [sys.executable, "-I", "-c", HARDENED_PROBE, sandbox_dir],
        stdout=subprocess.PIPE,  # a pipe: the probe may write no regular file (RLIMIT_FSIZE is 0)
        env={},
        timeout=60,
        check=True,
    )
    eperm = errno.EPERM
    expected = [("execv", eperm), ("fork", eperm), ("posix_spawn", eperm), ("subprocess", eperm), ("thread", "ran")]
    assert probe.stdout.decode().strip() == str(expected)


def test_a_destructuring_alternative_rule_matches_on_its_first_output() -> None:
    # libjq emits first()'s value twice through ?//; the rule's first output alone decides.
    rules = [{"id": "alt", "expr": "[1] as [$x] ?// $x | true", "action": {"queue": "work"}}]
    assert evaluate_in_process(rules, None, {"kind": "x"}).matched_index == 0
    rules = [{"id": "alt", "expr": "[1] as [$x] ?// $x | false", "action": {"queue": "work"}}]
    assert evaluate_in_process(rules, None, {"kind": "x"}).matched_index is None


# Rule budgets count the child's CPU time, not the wall clock: a starved child is not a slow rule.

BUSY_RULE = "[range(25000)] | length < 0"  # some milliseconds of CPU, well inside the 50 ms timeout; no match


def _cpu_seconds(pid: int) -> float | None:
    """Another process's CPU time (Linux's per-process CPU clock), None once it has gone."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return None


def _running_rule(sandbox: SandboxPool) -> tuple[int, int] | None:
    """(pid, rule index) of the child whose progress slot shows a rule of its current request running."""
    for child in list(sandbox._children):
        run, progress, pid = child._run, child._progress, child.pid
        if run is None or progress is None or pid is None:
            continue
        seq, index = PROGRESS.unpack_from(progress)[:2]
        if seq == run.seq and index >= 0:
            return pid, index
    return None


async def _stop_during_rule_0(sandbox: SandboxPool, task: asyncio.Task[Evaluation]) -> int | None:
    """SIGSTOP the child while rule 0 runs; the pid if it was caught mid-rule, else None (child left running)."""
    deadline = time.monotonic() + 10
    while not any(child._run is not None for child in list(sandbox._children)):  # until the request is sent
        assert not task.done() and time.monotonic() < deadline
        await asyncio.sleep(0)
    while (running := _running_rule(sandbox)) is None:  # a busy poll: rule 0 lasts some milliseconds
        if task.done() or time.monotonic() > deadline:
            return None
    pid, index = running
    os.kill(pid, signal.SIGSTOP)
    # Stopped: the slot is frozen. Rule 0 still running means the stop landed inside the rule.
    if index == 0 and _running_rule(sandbox) == (pid, 0):
        return pid
    os.kill(pid, signal.SIGCONT)
    return None


def test_the_busy_rule_costs_some_cpu_but_well_under_the_timeout() -> None:
    program = jq.compile(BUSY_RULE)
    started = time.thread_time()
    assert program.input_value({}).first() is False
    assert 0.003 < time.thread_time() - started < 0.035


async def test_a_runaway_rule_is_killed_after_about_its_cpu_time_and_the_next_rule_decides() -> None:
    sandbox = SandboxPool()
    try:
        await sandbox.evaluate(rules("true"), None, ENVELOPE)  # children started
        baseline = {pid: cpu for pid in sandbox.child_pids() if (cpu := _cpu_seconds(pid)) is not None}
        last = dict(baseline)
        task = asyncio.create_task(sandbox.evaluate(rules("def f: f; f", ".verified"), None, ENVELOPE))
        while not task.done():  # sample every child's CPU clock until the runaway's child is killed
            for pid in baseline:
                if (cpu := _cpu_seconds(pid)) is not None:
                    last[pid] = cpu
            await asyncio.sleep(0.001)
        result = task.result()
    finally:
        await sandbox.close()
    assert result.matched_index == 1
    assert causes(result) == [(0, "timeout")]
    assert result.faults[0].detail == "rule used 50 ms of CPU; child killed"
    used = max(last[pid] - baseline[pid] for pid in baseline)
    assert 0.04 <= used < 0.2, used  # about its 50 ms of CPU (the last sample can precede the kill a little)


async def test_a_cheap_rule_in_a_starved_child_is_not_killed() -> None:
    sandbox = SandboxPool()  # production limits: 50 ms per rule, 250 ms per event
    rule_list = rules(BUSY_RULE, ".verified")
    try:
        assert await sandbox.evaluate(rule_list, None, ENVELOPE) == Evaluation(matched_index=1)  # compiled
        for _ in range(20):  # until a stop lands inside rule 0 (a loaded machine may miss the window)
            task = asyncio.create_task(sandbox.evaluate(rule_list, None, ENVELOPE))
            pid = await _stop_during_rule_0(sandbox, task)
            if pid is None:
                assert await task == Evaluation(matched_index=1)
                continue
            await asyncio.sleep(0.2)  # four rule timeouts of wall-clock time with no CPU at all
            assert not task.done()
            os.kill(pid, signal.SIGCONT)
            assert await task == Evaluation(matched_index=1)  # no timeout fault: rule 0 used little CPU
            break
        else:
            pytest.fail("never caught rule 0 running")
    finally:
        await sandbox.close()


async def test_a_rule_stopped_past_its_wall_clock_bound_is_killed_and_the_next_rule_decides() -> None:
    sandbox = SandboxPool()
    rule_list = rules(BUSY_RULE, ".verified")
    stopped: list[int] = []
    try:
        assert await sandbox.evaluate(rule_list, None, ENVELOPE) == Evaluation(matched_index=1)
        for _ in range(20):
            started = time.monotonic()
            task = asyncio.create_task(sandbox.evaluate(rule_list, None, ENVELOPE))
            pid = await _stop_during_rule_0(sandbox, task)
            if pid is None:
                await task
                continue
            stopped.append(pid)  # never continued: only a wall-clock bound can end this rule
            result = await task
            elapsed = time.monotonic() - started
            break
        else:
            pytest.fail("never caught rule 0 running")
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await sandbox.close()
    assert result.matched_index == 1
    assert causes(result) == [(0, "timeout")]
    assert "1000 ms of wall-clock time" in (result.faults[0].detail or ""), result.faults[0].detail
    assert 1.0 <= elapsed < 1.9  # the rule's bound (20 timeouts), inside the 2 s hard deadline


async def test_a_child_stopped_for_good_is_ended_by_the_hard_deadline() -> None:
    sandbox = SandboxPool()
    pids: list[int] = []
    try:
        assert await sandbox.evaluate(rules("true"), None, ENVELOPE) == Evaluation(matched_index=0)
        deadline = time.monotonic() + 20
        while len(sandbox._idle) < 3:  # the two children and the spare, all stopped before the request
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        pids = [pid for child in sandbox._idle if (pid := child.pid) is not None]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        result = await sandbox.evaluate(rules(".verified"), None, ENVELOPE)
        elapsed = time.monotonic() - started
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await sandbox.close()
    assert result.matched_index is None
    assert causes(result) == [(-1, "sandbox_failure")]
    assert "hard deadline" in (result.faults[0].detail or "")
    assert 1.9 <= elapsed < 3.0


async def test_without_a_readable_cpu_clock_rules_are_timed_on_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("routing.sandbox.handle.cpu_clock_id", lambda pid: 12345)  # no such clock: EINVAL
    sandbox = SandboxPool()
    try:
        assert await sandbox.evaluate(rules(CLOSED), None, BIG_ENVELOPE) == Evaluation(matched_index=0)
        result = await sandbox.evaluate(rules("def f: f; f", ".verified"), None, ENVELOPE)
    finally:
        await sandbox.close()
    assert result.matched_index == 1
    assert causes(result) == [(0, "timeout")]
    assert result.faults[0].detail == "rule ran past 50 ms; child killed"  # no claim about CPU it did not read
    assert "rule budgets use wall-clock time" in caplog.text


async def test_pre_serialized_text_names_each_faulting_rule_and_why(pool: SandboxPool) -> None:
    # One combined program for the list; misses come back as bare positions, yet every fault keeps its rule.
    rule_list = rules(
        "false",
        '.payload.n | error("boom")',
        "not_a_function(1)",
        "def f: f; f",
        ".issue.labels[0] | ascii_downcase == 7",
        '.kind == "issues.opened"',
    )
    text = encode_input(None, ENVELOPE)
    result = await pool.evaluate_text(rule_list, text)
    assert result.matched_index == 5
    assert causes(result) == [(1, "error"), (2, "compile_error"), (3, "timeout")]
    assert [f.rule_id for f in result.faults] == ["r1", "r2", "r3"]
    assert all(f.detail for f in result.faults)  # why, for each
    assert result == await pool.evaluate(rule_list, None, ENVELOPE)


def test_a_miss_is_the_bare_position_and_anything_else_is_not_taken_for_one() -> None:
    engine = RuleEngine()

    class Outputs:
        def __init__(self, *outs: object) -> None:
            self.outs = outs

        def input_text(self, text: str) -> Iterator[object]:
            yield PARSED
            yield from self.outs

    misses = list(engine.evaluate(_Plan(Outputs(0, 1, [2, "match"]), {}), ["a", "b", "c"], b"[{},{}]"))
    assert misses == [(0, "nomatch", None), (1, "nomatch", None), (2, "match", None)]
    # A bool is not a position (True == 1 in Python), nor is another rule's position: both fault the rule.
    odd = list(engine.evaluate(_Plan(Outputs(0, True), {}), ["a", "b"], b"[{},{}]"))
    assert odd == [(0, "nomatch", None), (1, "error", "unexpected rule output")]
    skipped = list(engine.evaluate(_Plan(Outputs(1), {}), ["a", "b"], b"[{},{}]"))
    assert skipped[0] == (0, "error", "unexpected rule output")


def test_the_child_hears_of_every_rule_it_moves_on_to_and_gets_back_only_faults_and_the_match() -> None:
    """misses=False with started: what serve() uses. Every rule boundary reaches the clock before the rule runs."""
    engine = RuleEngine()

    class Outputs:
        def __init__(self, *outs: object) -> None:
            self.outs = outs
            self.pulled = 0

        def input_text(self, text: str) -> Iterator[object]:
            yield PARSED
            for out in self.outs:
                self.pulled += 1
                yield out

    program = Outputs(0, [1, "error", "boom"], 2, 4, [5, "match"], 6)
    seen: list[tuple[int, int]] = []  # (rule the clock was told of, outputs pulled by then)
    outcomes = list(
        engine.evaluate(
            _Plan(program, {3: "compile failed"}),
            ["a", "b", "c", "d", "e", "f", "g"],
            b"[{},{}]",
            started=lambda position: seen.append((position, program.pulled)),
            misses=False,
        )
    )
    assert outcomes == [(1, "error", "boom"), (3, "compile_error", "compile failed"), (5, "match", None)]
    # Told of rule n+1 after rule n's output and before rule n+1's is pulled; never past the match.
    assert seen == [(1, 1), (2, 2), (3, 3), (4, 3), (5, 4)]
    everything = list(engine.evaluate(_Plan(Outputs(0, [1, "match"]), {}), ["a", "b"], b"[{},{}]", misses=True))
    assert everything == [(0, "nomatch", None), (1, "match", None)]
