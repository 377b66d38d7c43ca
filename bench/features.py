"""What each of RouteDelivery's Temporal features costs on this server: the featured floor, one feature left out.

bench/ingest.py measures two floors: the bare floor (a workflow with two no-op local activities, started eagerly
from a client whose worker runs in this process) and the featured floor (the same with what RouteDelivery asks of
Temporal besides its activities). This splits the gap between them. Each path below is the featured floor with one
feature left out, so its gain over the featured floor is what that feature costs here:

* the upsert of the sender's and the decision's search attributes at the end (DESIGN.md "the workflow upserts
  search attributes");
* the run's summary and details at start (the Temporal UI's list and run page; runtime/starts.py);
* the local activities' summaries (the UI's timeline);
* the endpoint's fairness key at start (ADR-0025: one endpoint's flood cannot hold another's deliveries).

Rounds alternate the paths, so drift in the shared server hits all alike. On a shared 2-core machine one feature's
figure moves by several percent between runs, in both directions (two 8-round runs here put the upsert at 1.09 and
1.03 of the featured floor, the activity summaries at 1.06 and 0.99, the fairness key at 1.00 and 0.94), while all
of them together stayed near a tenth of the floor (featured / floor 0.88 and 0.90): read several runs before
trusting a single feature's figure.

    python bench/features.py [--deliveries 960] [--rounds 8] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import dev_stack, drive

PAYLOAD = "x" * 2000  # about the size of the ingest benchmark's delivery


async def run_all(address: str, args: argparse.Namespace) -> dict[str, float]:
    """Deliveries per second of each path, rounds alternating."""
    from temporalio.client import Client
    from temporalio.common import Priority
    from temporalio.worker import Worker

    from bench._floor_worker import (
        FeaturedFloor,
        FeaturedFloorNoSummaries,
        FeaturedFloorNoUpsert,
        Floor,
        noop_a,
        noop_b,
    )
    from bench.ingest import FEATURED_DETAILS

    client = await Client.connect(address)
    task_queue = f"features-{uuid.uuid4().hex[:8]}"

    def starter(run: Any, *, metadata: bool = True, fairness: bool = True) -> Callable[[int], Awaitable[None]]:
        async def one(i: int) -> None:
            options: dict[str, Any] = {}
            if metadata:
                options.update(static_summary=f"github issues opened acme/app#{i}", static_details=FEATURED_DETAILS)
            if fairness:
                options.update(priority=Priority(fairness_key="ep_0123456789abcdef"))
            await client.execute_workflow(
                run,
                PAYLOAD,
                id=f"{task_queue}-{uuid.uuid4().hex}",
                task_queue=task_queue,
                execution_timeout=timedelta(seconds=60),
                request_eager_start=True,
                **options,
            )

        return one

    paths = {
        "floor": starter(Floor.run, metadata=False, fairness=False),
        "featured": starter(FeaturedFloor.run),
        "without the upsert": starter(FeaturedFloorNoUpsert.run),
        "without summary and details at start": starter(FeaturedFloor.run, metadata=False),
        "without activity summaries": starter(FeaturedFloorNoSummaries.run),
        "without the fairness key": starter(FeaturedFloor.run, fairness=False),
    }
    elapsed = dict.fromkeys(paths, 0.0)
    per_round = max(1, args.deliveries // args.rounds)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[Floor, FeaturedFloor, FeaturedFloorNoUpsert, FeaturedFloorNoSummaries],
        activities=[noop_a, noop_b],
        max_concurrent_local_activities=50,
    ):
        for one in paths.values():
            await drive(args.warmup, args.concurrency, one)
        for _ in range(args.rounds):
            for name, one in paths.items():
                took, _ = await drive(per_round, args.concurrency, one)
                elapsed[name] += took
    return {name: per_round * args.rounds / seconds for name, seconds in elapsed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=960, help="per path, split over the rounds")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=40)
    args = parser.parse_args()
    with dev_stack() as stack:
        rates = asyncio.run(run_all(stack.temporal_address, args))
    floor, featured = rates["floor"], rates["featured"]
    print(
        f"\nRouteDelivery's Temporal features, one left out at a time: {args.deliveries} runs per path in "
        f"{args.rounds} alternating rounds, concurrency {args.concurrency}, dev server (SQLite file), eager start\n"
    )
    print(f"{'path':<44} {'runs/s':>8} {'/ floor':>8} {'/ featured':>11}")
    for name, rate in rates.items():
        print(f"{name:<44} {rate:>8.1f} {rate / floor:>8.2f} {rate / featured:>11.2f}")
    print(
        f"\nall features together: featured / floor {featured / floor:.2f}; a feature's cost is its row's "
        "'/ featured' above 1.00"
    )


if __name__ == "__main__":
    main()
