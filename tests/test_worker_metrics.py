"""A worker process's metrics listener serves the process registry, the Temporal SDK's own metrics included."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.models import UpkeepInput, UpkeepResult
from switchboard.temporal import schedule_ids
from tests.conftest import make_settings
from tests.helpers import eventually
from worker import run_worker
from workflows.upkeep import ReapTodos


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_worker_listener_serves_temporal_sdk_metrics_after_a_workflow_runs(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    client: Client = temporal_env.client
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    settings = make_settings(tmp_path, database_url, client.service_client.config.target_host, task_queue)
    settings.worker_metrics_port = free_port()
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop))
    url = f"http://127.0.0.1:{settings.worker_metrics_port}/metrics"
    try:
        async with httpx.AsyncClient(timeout=10) as http:

            async def scrape() -> str | None:
                if worker.done():
                    await worker  # surfaces a start-up failure instead of polling until the timeout
                with contextlib.suppress(httpx.TransportError):
                    resp = await http.get(url)
                    return resp.text if resp.status_code == 200 else None
                return None

            text = await eventually(scrape)
            assert "switchboard_ingest_requests" in text  # the same registry as the API's /metrics
            # The suite's client starts a workflow the worker (on its own client and Runtime) runs.
            result = await client.execute_workflow(
                ReapTodos.run, UpkeepInput(), id=f"reap-{uuid.uuid4().hex}", task_queue=task_queue
            )
            assert isinstance(result, UpkeepResult)

            def completed(text: str) -> float:
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if (
                            sample.name == "temporal_workflow_completed_total"
                            and sample.labels.get("workflow_type") == "ReapTodos"
                            and sample.labels.get("task_queue") == task_queue
                        ):
                            return sample.value
                return 0.0

            async def after_run() -> str | None:
                got = await scrape()
                return got if got is not None and completed(got) >= 1 else None

            text = await eventually(after_run)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            latency = families["temporal_workflow_endtoend_latency_seconds"]
            assert latency.type == "histogram"
            assert any(s.name.endswith("_bucket") and s.labels.get("le") == "+Inf" for s in latency.samples)
            assert families["temporal_worker_task_slots_available"].type == "gauge"
            assert "temporal_request" in families and families["temporal_request"].type == "counter"
    finally:
        stop.set()
        await worker
        for schedule_id in schedule_ids(task_queue).values():
            with contextlib.suppress(Exception):
                await client.get_schedule_handle(schedule_id).delete()
    # The listener is gone with the worker.
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", settings.worker_metrics_port)) != 0
