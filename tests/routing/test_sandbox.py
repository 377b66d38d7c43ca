"""The jq sandbox: first-match-wins evaluation in warm, capped, killable child processes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from routing.models import Evaluation
from routing.sandbox import ProtocolViolation, Reply, SandboxPool, evaluate_in_process, parse_reply
from routing.sandbox_child import refusal

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
    assert elapsed < 0.5


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
    sandbox = SandboxPool(max_children=1, rule_timeout=0.5, event_budget=1.0, acquire_timeout=0.02)
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
async def test_sandbox_agrees_with_in_process_evaluation(pool: SandboxPool, rule_list: list[dict[str, Any]]) -> None:
    for params in (None, {"q": 1, "trusted_humans": ["a"]}):
        assert await pool.evaluate(rule_list, params, ENVELOPE) == evaluate_in_process(rule_list, params, ENVELOPE)


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
