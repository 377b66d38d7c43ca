"""Save-time compile checks in the sandbox child: libjq's constant folding never runs in the caller (issue 8)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest

from routing.rules import COMPILE_LIMIT, CompileCheckUnavailable, compile_failure
from routing.sandbox import SandboxPool
from tests.routing.jq_reference import reference_compiles
from tests.routing.test_sandbox import ENVELOPE, causes, rules

# Folded while compiling: 200 MB and 1 GB strings, past the child's 128 MiB address-space cap.
TOO_BIG = ['"x" * 200000000 | length > 0', '"x" * 1e9 | length > 0']
ORDINARY = ["true", ".verified", '.kind == "issues.opened"', "$params.x == 1", "def f: f; f", "[range(1e9)] | length"]
BROKEN = [".a ==", "if true then 1", "$nope", "nosuchfunction(1)"]


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    sandbox = SandboxPool()
    yield sandbox
    await sandbox.close()


async def test_the_child_check_agrees_with_libjq_compiling_each_expression(pool: SandboxPool) -> None:
    exprs = ORDINARY + BROKEN
    verdicts = await pool.check(exprs)
    assert [v is None for v in verdicts] == [reference_compiles(e) for e in exprs]
    assert verdicts[: len(ORDINARY)] == [None] * len(ORDINARY)
    assert all(v is not None and v.startswith(compile_failure("")) for v in verdicts[len(ORDINARY) :]), verdicts


async def test_a_compile_past_the_memory_cap_is_refused_and_the_rest_still_checked(pool: SandboxPool) -> None:
    before = vm_hwm_kib()
    exprs = ["true", TOO_BIG[0], ".a ==", TOO_BIG[1], ".verified"]
    verdicts = await pool.check(exprs)
    assert verdicts[0] is None and verdicts[4] is None
    assert verdicts[1] == COMPILE_LIMIT and verdicts[3] == COMPILE_LIMIT
    assert verdicts[2] is not None and verdicts[2].startswith("expression does not compile")
    # libjq allocated those strings in a child, not here.
    assert vm_hwm_kib() - before < 8 * 1024
    # The killed children were replaced: the pool still evaluates.
    assert (await pool.evaluate(rules("false", "true"), None, ENVELOPE)).matched_index == 1


async def test_an_empty_check_starts_no_child() -> None:
    sandbox = SandboxPool()
    try:
        assert await sandbox.check([]) == []
        assert sandbox.child_pids() == []
    finally:
        await sandbox.close()


async def test_no_child_within_the_hard_deadline_is_unavailable_never_accepted() -> None:
    sandbox = SandboxPool(hard_deadline=0.001)  # no child can even start in time
    try:
        with pytest.raises(CompileCheckUnavailable, match="hard deadline"):
            await sandbox.check(["true", ".verified"])
    finally:
        await sandbox.close()


async def test_a_compile_past_the_hard_deadline_refuses_the_expression_compiling_then() -> None:
    sandbox = SandboxPool(hard_deadline=1.0)
    # Each folds 100 MB (under the cap, about 0.2 s here): twenty of them cannot all compile within 1 s.
    exprs = [f'"x" * {10**8 + i} | length > 0' for i in range(20)]
    try:
        await sandbox.check(["true"])  # a warm child: the deadline is the compiles' alone
        verdicts = await sandbox.check(exprs)
    finally:
        await sandbox.close()
    assert COMPILE_LIMIT in verdicts, verdicts
    first = verdicts.index(COMPILE_LIMIT)
    assert verdicts[:first] == [None] * first
    assert all(v is not None and v.startswith(COMPILE_LIMIT) for v in verdicts[first:]), verdicts


async def test_no_slot_or_a_closed_pool_is_unavailable_never_accepted() -> None:
    sandbox = SandboxPool(max_children=1, rule_timeout=0.5, event_budget=1.0, acquire_timeout=0.02)
    try:
        holder = asyncio.create_task(sandbox.evaluate(rules("def f: f; f"), None, ENVELOPE))
        await asyncio.sleep(0.05)
        with pytest.raises(CompileCheckUnavailable, match="no sandbox slot"):
            await sandbox.check(["true"])
        assert causes(await holder) == [(0, "timeout")]
    finally:
        await sandbox.close()
    with pytest.raises(CompileCheckUnavailable, match="closed"):
        await sandbox.check(["true"])


FORGING_CHILD = r"""
import json, sys
out = sys.stdout.buffer
out.write(b"SBX1 [0,\"ready\"]\n"); out.flush()
for line in sys.stdin.buffer:
    seq = json.loads(line.partition(b"\t")[0])["seq"]
    out.write(b"SBX1 [%d,\"r\",7,\"compile_error\",\"x\"]\n" % seq); out.flush()
"""


async def test_a_malformed_check_reply_refuses_everything_unchecked() -> None:
    sandbox = SandboxPool()
    sandbox._argv = [sys.executable, "-I", "-c", FORGING_CHILD]
    try:
        verdicts = await sandbox.check(["true", ".verified"])
    finally:
        await sandbox.close()
    assert all(v is not None and v.startswith("expression could not be compile-checked") for v in verdicts), verdicts
