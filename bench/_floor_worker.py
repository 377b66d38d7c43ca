"""The floor's worker: a workflow with two no-op local activities, sandboxed like RouteDelivery."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker


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


async def main() -> None:
    client = await Client.connect(sys.argv[1])
    async with Worker(
        client,
        task_queue=sys.argv[2],
        workflows=[Floor],
        activities=[noop_a, noop_b],
        max_concurrent_local_activities=50,
    ):
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
