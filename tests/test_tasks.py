"""switchboard.tasks.stop: a background task stops even when one cancellation is lost."""

from __future__ import annotations

import asyncio
import logging

import pytest

from switchboard import tasks


async def test_a_task_that_loses_a_cancellation_still_stops() -> None:
    cancels = 0

    async def loop() -> None:
        nonlocal cancels
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels += 1
                if cancels == 1:
                    continue  # what asyncio.wait_for does on 3.11 when the cancel meets a ready result
                raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    assert await tasks.stop(task) is True
    assert task.cancelled() and cancels == 2


async def test_a_task_that_does_not_stop_in_time_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    holding = True

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not holding:
                    raise

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="switchboard.tasks"):
        assert await tasks.stop(task, within=0.3) is False
    assert not task.done()
    assert any("stubborn" in r.getMessage() and "did not stop" in r.getMessage() for r in caplog.records)
    holding = False
    assert await tasks.stop(task) is True


@pytest.mark.parametrize("ending", ["returns", "raises"])
async def test_an_ended_task_is_stopped_and_its_outcome_dropped(ending: str) -> None:
    async def work() -> None:
        if ending == "raises":
            raise RuntimeError("already failed")

    task = asyncio.create_task(work())
    await asyncio.sleep(0)
    assert task.done()
    assert await tasks.stop(task) is True
