"""The fault campaign with small counts (bench/faults.py runs it in full): real processes, exact counts.

One stack of real OS processes for the module (embedded PostgreSQL, the Temporal dev server, `switchboard api`,
`switchboard worker`); each scenario uses its own endpoint and webhook, so its counts are its own. Whatever
the fault, a delivery answered 202 has exactly one event and one todo after recovery.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.faults import SCENARIOS, SMALL, FaultStack, Outcome, fault_stack

# Each scenario runs real processes through a fault and its recovery; the first also starts the module's stack.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def procs() -> Iterator[FaultStack]:
    # SWITCHBOARD_FAULTS_CODE: run the service processes from another checkout (this one by default).
    code = os.environ.get("SWITCHBOARD_FAULTS_CODE")
    with fault_stack(apis=1, workers=1, code=Path(code) if code else None) as stack:
        yield stack


@pytest.fixture
async def faults(procs: FaultStack) -> AsyncIterator[FaultStack]:
    async with procs.supervised():
        yield procs


async def run(stack: FaultStack, name: str) -> Outcome:
    out = await SCENARIOS[name](stack, SMALL)
    print(f"\n{Outcome.header()}\n{out.row()}\n{out.details()}")
    return out


def assert_nothing_lost_or_doubled(out: Outcome) -> None:
    assert out.sent > 0 and out.accepted > 0, out.details()
    assert out.lost == 0, out.details()
    assert out.doubled == 0, out.details()
    assert out.inbox_left == 0, out.details()
    # Every event is one of the deliveries we sent, with its one todo.
    assert out.events == out.todos, out.details()


def assert_no_503_while_postgres_is_up(out: Outcome) -> None:
    # Accept first: Temporal's trouble never reaches the producer (the inbox takes the delivery).
    assert out.unavailable == 0, out.details()


async def test_worker_sigkill_mid_delivery_under_load(faults: FaultStack) -> None:
    out = await run(faults, "worker")
    assert_nothing_lost_or_doubled(out)
    assert_no_503_while_postgres_is_up(out)
    # A commit retried after it committed reports its own first outcome.
    assert out.first_said_duplicate == 0, out.details()


async def test_temporal_stopped_under_load_then_restarted(faults: FaultStack) -> None:
    out = await run(faults, "temporal")
    assert_nothing_lost_or_doubled(out)
    assert_no_503_while_postgres_is_up(out)
    assert out.pending > 0, out.details()  # accepted into the inbox while Temporal was down


async def test_postgres_stopped_under_load_then_restarted(faults: FaultStack) -> None:
    out = await run(faults, "postgres")
    assert_nothing_lost_or_doubled(out)
    # 503 only while PostgreSQL is down (nothing can verify then), never once it is back: the pools' reconnect
    # rounds are short (store/db.py RECONNECT_SECONDS), so they refill within about a second.
    assert not out.unavailable_outside_fault, f"503 after PostgreSQL was back: {out.details()}"


async def test_api_restarted_under_load(faults: FaultStack) -> None:
    out = await run(faults, "api")
    assert_nothing_lost_or_doubled(out)
    assert_no_503_while_postgres_is_up(out)


async def test_duplicate_storm(faults: FaultStack) -> None:
    out = await run(faults, "storm")
    assert_nothing_lost_or_doubled(out)
    assert out.events == SMALL.storm_ids and out.todos == SMALL.storm_ids, out.details()
    assert out.accepted == SMALL.storm_ids * SMALL.storm_posts, out.details()
    # Exactly one answer per id says created: the call whose start made the run. (Should that call have
    # answered `pending` instead, no answer can say created, and none may.)
    for delivery, created in out.created_answers.items():
        assert created == 1 or (created == 0 and delivery in out.pending_ids), out.details()


async def test_scale_out_two_apis_two_workers_one_of_each_killed(faults: FaultStack) -> None:
    out = await run(faults, "scaleout")
    assert_nothing_lost_or_doubled(out)
    assert_no_503_while_postgres_is_up(out)
    # One ring per todo across both API processes: none twice, and every todo rung on one of the streams.
    assert out.ring_dups == 0, out.details()
    assert out.rings == out.todos, out.details()


async def test_api_down_while_github_sends_then_reconcile(faults: FaultStack) -> None:
    out = await run(faults, "reconcile")
    # GitHub's connections were refused while no API process listened: lost to a receiver alone.
    assert out.other.get("no answer (refused)", 0) > 0, out.details()
    # Every delivery GitHub sent, refused or not, ends with exactly one event and one todo.
    assert out.lost == 0 and out.doubled == 0, out.details()
    assert out.events == out.sent == out.todos, out.details()


# -- client bounds (issue 29): each row holds its bound under load, and loses and strands nothing ------------------


def assert_bound_held(out: Outcome) -> None:
    assert_nothing_lost_or_doubled(out)
    assert out.stranded == 0, out.details()
    assert out.unavailable == 0, out.details()
    assert out.bound_held is True, out.details()


async def test_slow_clients_from_one_address_keep_no_one_else_out(faults: FaultStack) -> None:
    assert_bound_held(await run(faults, "slow"))


async def test_producers_hanging_up_mid_body_are_disconnects_not_500s(faults: FaultStack) -> None:
    assert_bound_held(await run(faults, "hangups"))


async def test_stored_hostile_bodies_are_accepted_and_read_back(faults: FaultStack) -> None:
    assert_bound_held(await run(faults, "bodies"))


async def test_hostile_verb_calls_are_refused_before_they_are_applied(faults: FaultStack) -> None:
    assert_bound_held(await run(faults, "calls"))


# -- stalls (issue 29, findings 1 and 2): nothing one tenant sends, and no hung database, holds anyone else ---------


async def test_hostile_text_bodies_become_events_and_poison_rows_never_hold_other_tenants(faults: FaultStack) -> None:
    assert_bound_held(await run(faults, "textbodies"))


async def test_a_frozen_postgres_answers_within_its_bounds_and_recovers_without_a_restart(faults: FaultStack) -> None:
    out = await run(faults, "pgfreeze")
    assert_nothing_lost_or_doubled(out)
    assert out.stranded == 0, out.details()
    # Nothing can be verified while PostgreSQL hangs: ingest answers 503 then (within its bound, in bound_held).
    assert out.unavailable > 0, out.details()
    assert out.bound_held is True, out.details()
