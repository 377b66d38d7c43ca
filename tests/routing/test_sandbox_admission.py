"""The fast path's admission (SandboxPool.evaluate_if_free): a free slot nobody waits for, or None at once."""

from __future__ import annotations

import asyncio

from routing.sandbox import SandboxPool

ENVELOPE = {"source": "github", "kind": "issues", "payload": {"n": 1}}
MATCH = [{"expr": '.kind == "issues"', "action": {"queue": "work"}}]
# About 200 ms of libjq work, under the roomy clocks below: holds a child long enough to look at the pool.
SLOW = [{"expr": "[range(300000)] | length < 0", "action": {"drop": True}}]


def roomy(slots: int) -> SandboxPool:
    return SandboxPool(max_children=slots, rule_timeout=5.0, event_budget=5.0, hard_deadline=10.0)


async def test_an_idle_pool_evaluates_at_once() -> None:
    pool = roomy(1)
    try:
        result = await pool.evaluate_if_free(MATCH, None, ENVELOPE)
        assert result is not None and result.matched_index == 0 and not result.faults
        # The slot came back: the next one is admitted too.
        again = await pool.evaluate_if_free(MATCH, None, ENVELOPE)
        assert again is not None and again.matched_index == 0
    finally:
        await pool.close()


async def test_no_free_slot_answers_none_at_once() -> None:
    pool = roomy(1)
    try:
        holder = asyncio.create_task(pool.evaluate(SLOW, None, ENVELOPE))
        while not pool._slots.locked():  # the holder took the one slot
            await asyncio.sleep(0.005)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await pool.evaluate_if_free(MATCH, None, ENVELOPE) is None
        assert loop.time() - started < 0.05  # never waited for the holder
        held = await holder
        assert held.matched_index is None and not held.faults
    finally:
        await pool.close()


async def test_a_waiting_evaluation_is_never_overtaken() -> None:
    pool = roomy(1)
    try:
        holder = asyncio.create_task(pool.evaluate(SLOW, None, ENVELOPE))
        while not pool._slots.locked():
            await asyncio.sleep(0.005)
        # An evaluation admitted through the fair queue now waits for the slot.
        waiter = asyncio.create_task(pool.evaluate(MATCH, None, ENVELOPE, wait=30.0))
        await asyncio.sleep(0)
        await holder
        # The slot is being handed to the waiter: the fast path does not barge past it.
        assert await pool.evaluate_if_free(MATCH, None, ENVELOPE) is None
        waited = await waiter
        assert waited.matched_index == 0 and not waited.faults
        assert await pool.evaluate_if_free(MATCH, None, ENVELOPE) is not None  # free again, nobody waiting
    finally:
        await pool.close()


async def test_a_closed_pool_admits_nothing() -> None:
    pool = roomy(1)
    await pool.close()
    assert await pool.evaluate_if_free(MATCH, None, ENVELOPE) is None
