"""The fault campaign's scenarios: one function per fault, registered by name in `SCENARIOS`.

A scenario is ``async def name(stack: FaultStack, counts: Counts) -> Outcome``: it makes its own webhook
(`stack.hook`), applies its fault (most through `under_load`), and returns the exact counts (`tally`). Add one by
writing the function here and a row in `SCENARIOS`; `tests/test_faults.py` runs each with `SMALL` counts and
`bench/faults.py` with `FULL` ones.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from tests.faults.counts import Counts
from tests.faults.producers import Load, Rings, storm
from tests.faults.stack import FaultStack, Hook
from tests.faults.tally import Outcome, tally

Fault = Callable[[Load], Awaitable[list[tuple[float, float]]]]
"""Applies a fault while the load runs; returns the fault windows (wall-clock start, end)."""


async def under_load(stack: FaultStack, hook: Hook, counts: Counts, name: str, fault: Fault) -> Outcome:
    """Load for `lead` s, the fault, load for `tail` s more; then recovery and the exact counts."""
    crashes = len(stack.crashes)
    load = Load(stack, hook, senders=counts.senders, interval=counts.interval)
    load.start()
    try:
        await asyncio.sleep(counts.lead)
        windows = await fault(load)
        await asyncio.sleep(counts.tail)
    finally:
        answers = await load.stop()
    out = await tally(stack, hook, name, answers, faults=windows)
    out.crashes = len(stack.crashes) - crashes
    if load.failovers:
        out.notes.append(
            f"connection refused, sent to the other API instead (as a load balancer does): {load.failovers}"
        )
    return out


async def worker_kills(stack: FaultStack, counts: Counts) -> Outcome:
    """SIGKILL the worker mid-delivery `worker_kills` times under load; each time it is started again."""
    hook = await asyncio.to_thread(stack.hook, "worker-kill")
    worker = stack.workers[0]

    async def fault(load: Load) -> list[tuple[float, float]]:
        windows = []
        for _ in range(counts.worker_kills):
            await load.until(counts.senders)  # deliveries are in flight
            await asyncio.sleep(random.uniform(0.1, 0.6))
            killed = time.time()
            await asyncio.to_thread(worker.kill)
            await asyncio.to_thread(stack.start_worker, worker)
            windows.append((killed, time.time()))
        return windows

    return await under_load(stack, hook, counts, f"worker SIGKILL ×{counts.worker_kills}", fault)


async def temporal_outage(stack: FaultStack, counts: Counts) -> Outcome:
    """Stop the Temporal dev server for `outage` seconds under load, then start it on the same file and port."""
    hook = await asyncio.to_thread(stack.hook, "temporal-outage")
    assert stack.temporal is not None
    temporal = stack.temporal

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        await asyncio.to_thread(temporal.stop)
        await asyncio.sleep(counts.outage)
        await asyncio.to_thread(stack.start_temporal)
        return [(began, time.time())]  # the fault ends when the server listens again

    return await under_load(stack, hook, counts, f"Temporal stopped {counts.outage:.0f} s", fault)


async def temporal_freeze(stack: FaultStack, counts: Counts) -> Outcome:
    """Freeze the Temporal dev server (SIGSTOP) for `outage` seconds under load: connections hang, not refuse."""
    hook = await asyncio.to_thread(stack.hook, "temporal-freeze")
    assert stack.temporal is not None
    temporal = stack.temporal

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        temporal.freeze()
        await asyncio.sleep(counts.outage)
        temporal.thaw()
        return [(began, time.time())]

    return await under_load(stack, hook, counts, f"Temporal frozen {counts.outage:.0f} s", fault)


async def postgres_outage(stack: FaultStack, counts: Counts) -> Outcome:
    """Stop PostgreSQL (fast shutdown) for `outage` seconds under load, then start it on the same data dir."""
    hook = await asyncio.to_thread(stack.hook, "postgres-outage")

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        await asyncio.to_thread(stack.pg.stop)
        await asyncio.sleep(counts.outage)
        await asyncio.to_thread(stack.pg.start)  # pg_ctl -w: returns once it accepts connections
        return [(began, time.time())]

    return await under_load(stack, hook, counts, f"PostgreSQL stopped {counts.outage:.0f} s", fault)


async def api_restarts(stack: FaultStack, counts: Counts) -> Outcome:
    """Restart the (one) API process under load: SIGTERM (uvicorn drains what is in flight), then start again."""
    hook = await asyncio.to_thread(stack.hook, "api-restart")
    api = stack.apis[0]

    async def fault(load: Load) -> list[tuple[float, float]]:
        windows = []
        for _ in range(counts.api_restarts):
            await load.until(counts.senders)
            began = time.time()
            await asyncio.to_thread(api.stop)
            await asyncio.to_thread(stack.start_api, api)
            windows.append((began, time.time()))
        return windows

    return await under_load(stack, hook, counts, f"API restarted ×{counts.api_restarts}", fault)


async def duplicate_storm(stack: FaultStack, counts: Counts) -> Outcome:
    """`storm_ids` delivery ids, each posted `storm_posts` times concurrently."""
    hook = await asyncio.to_thread(stack.hook, "storm")
    answers = await storm(stack, hook, counts.storm_ids, counts.storm_posts, counts.storm_concurrency)
    return await tally(stack, hook, f"duplicate storm {counts.storm_ids}×{counts.storm_posts}", answers, faults=None)


async def scale_out(stack: FaultStack, counts: Counts) -> Outcome:
    """Two APIs and two workers (separate processes) on one PostgreSQL and one Temporal; an SSE client on each
    API for the same endpoint; load over both APIs; SIGKILL one worker and one API mid-load, both restarted."""
    while len(stack.apis) < 2:
        await asyncio.to_thread(stack.add_api)
    while len(stack.workers) < 2:
        await asyncio.to_thread(stack.add_worker)
    hook = await asyncio.to_thread(stack.hook, "scale-out")
    rings = [Rings(stack.base(api), hook.credential) for api in stack.apis[:2]]
    for r in rings:
        r.start()
    await asyncio.wait_for(asyncio.gather(*(r.subscribed.wait() for r in rings)), 60)
    worker, api = stack.workers[1], stack.apis[1]

    async def fault(load: Load) -> list[tuple[float, float]]:
        await load.until(counts.senders * 2)
        began = time.time()
        await asyncio.to_thread(worker.kill)
        await load.until(counts.senders)
        await asyncio.to_thread(api.kill)
        api_killed = time.time()
        await asyncio.to_thread(stack.start_worker, worker)
        await asyncio.to_thread(stack.start_api, api)
        return [(began, api_killed), (api_killed, time.time())]

    out = await under_load(stack, hook, counts, "scale-out 2 API + 2 workers", fault)
    # Rings travel after the commit: give the last ones a moment, then compare with the todos.
    deadline = time.monotonic() + 10
    while sum(len(r.todo_ids) for r in rings) < out.todos and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    for r in rings:
        await r.stop()
    every = [t for r in rings for t in r.todo_ids]
    out.rings = len(every)
    out.ring_dups = len(every) - len(set(every))
    todo_ids = {
        str(r[0])
        for r in await asyncio.to_thread(stack.sql, "SELECT id FROM todos WHERE endpoint_id = %s", hook.endpoint_id)
    }
    unrung = todo_ids - set(every)
    out.notes.append(f"todos never rung on a client: {len(unrung)}; per API rings {[len(r.todo_ids) for r in rings]}")
    shared = await asyncio.to_thread(stack.has_shared_doorbell)
    if unrung and shared:
        # Which were claimed by a process (rung_at set) but never reached its client: the killed API's in-flight.
        claimed = await asyncio.to_thread(
            stack.count, "SELECT count(*) FROM todos WHERE id = ANY(%s) AND rung_at IS NOT NULL", list(unrung)
        )
        out.notes.append(f"of those, claimed (rung_at set) but not received: {claimed}")
    out.unrung = len(unrung)
    return out
