"""The worker's periodic full collection: cycles left by finished runs are reclaimed, the start-up heap is frozen."""

from __future__ import annotations

import asyncio
import gc
import weakref

from worker import _collecting


class _Node:
    """One half of a reference cycle, as a finished workflow run leaves behind."""

    def __init__(self) -> None:
        self.other: _Node | None = None


async def test_a_reference_cycle_is_collected_by_the_worker_s_periodic_pass_and_the_freeze_is_undone() -> None:
    gc.disable()  # only the worker's pass may collect, so the test fails if that pass never runs
    try:
        async with _collecting(0.05):
            assert gc.get_freeze_count() > 0  # the heap alive at start is out of every pass
            a, b = _Node(), _Node()
            a.other, b.other = b, a
            gone = weakref.ref(a)
            del a, b
            assert gone() is not None  # a cycle: reference counting alone never frees it
            for _ in range(200):
                if gone() is None:
                    break
                await asyncio.sleep(0.02)
            assert gone() is None
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()
