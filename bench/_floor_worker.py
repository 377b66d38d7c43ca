"""The floors' worker: workflows with two no-op local activities, sandboxed like RouteDelivery.

`Floor` is the bare floor of issue 14's target. `FeaturedFloor` adds what RouteDelivery asks of Temporal besides
its activities, with the same shapes: an activity summary per local activity, one upsert of the sender's and the
decision's search attributes at the end and the run's current details; its client starts it with RouteDelivery's
summary and details and the endpoint's fairness key, and no search attributes (bench/ingest.py). The gap between the
two floors is Temporal's own cost of those features on this server.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from workflows import search


@activity.defn(name="noop_a")
async def noop_a(x: str) -> str:
    return x


@activity.defn(name="noop_b")
async def noop_b(x: str) -> str:
    return x


@workflow.defn(name="Floor")
class Floor:
    @workflow.run
    async def run(self, x: str) -> str:
        y = await workflow.execute_local_activity(noop_a, x, start_to_close_timeout=timedelta(seconds=10))
        return await workflow.execute_local_activity(noop_b, y, start_to_close_timeout=timedelta(seconds=10))


async def _featured(x: str, *, upsert: bool = True, summaries: bool = True) -> str:
    """FeaturedFloor's body; bench/features.py leaves one feature out at a time."""
    y = await workflow.execute_local_activity(
        noop_a,
        x,
        start_to_close_timeout=timedelta(seconds=10),
        summary="webhook wh_0123456789abcdef" if summaries else None,
    )
    z = await workflow.execute_local_activity(
        noop_b, y, start_to_close_timeout=timedelta(seconds=10), summary="commit queue" if summaries else None
    )
    if upsert:
        workflow.upsert_search_attributes(
            [
                search.WEBHOOK_ID.value_set("wh_0123456789abcdef"),
                search.SOURCE.value_set("github"),
                search.KIND.value_set("issues"),
                search.DELIVERY_ID.value_set(workflow.info().workflow_id[-32:]),
                search.DECISION.value_set("queue"),
                search.RULE_ID.value_set("rl_0123456789abcdef"),
                search.EVENT_ID.value_set(f"ev_{workflow.info().run_id[:24]}"),
            ]
        )
    workflow.set_current_details("**decision** queue\n\n**event** `ev_0123456789abcdef`\n\n**todos** 1 (1 new)")
    return z


@workflow.defn(name="FeaturedFloor")
class FeaturedFloor:
    @workflow.run
    async def run(self, x: str) -> str:
        return await _featured(x)


@workflow.defn(name="FeaturedFloorNoUpsert")
class FeaturedFloorNoUpsert:
    """FeaturedFloor without the search-attribute upsert at the end."""

    @workflow.run
    async def run(self, x: str) -> str:
        return await _featured(x, upsert=False)


@workflow.defn(name="FeaturedFloorNoSummaries")
class FeaturedFloorNoSummaries:
    """FeaturedFloor without its local activities' summaries."""

    @workflow.run
    async def run(self, x: str) -> str:
        return await _featured(x, summaries=False)


async def main() -> None:
    client = await Client.connect(sys.argv[1])
    async with Worker(
        client,
        task_queue=sys.argv[2],
        workflows=[Floor, FeaturedFloor, FeaturedFloorNoUpsert, FeaturedFloorNoSummaries],
        activities=[noop_a, noop_b],
        max_concurrent_local_activities=50,
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
