"""A `switchboard worker` process serves its registry on its metrics port and the Temporal SDK's own metrics, from
the SDK's exporter, on the Temporal metrics port; a port it cannot bind refuses to start."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities.models import UpkeepInput, UpkeepResult
from runtime.schedules import schedule_ids
from tests.helpers import eventually
from workflows.upkeep import ReapTodos

BIN = Path(sys.executable).parent
DASHBOARD = json.loads((Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "switchboard.json").read_text())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    task_queue: str
    metrics_port: int
    sdk_port: int


def start_worker(tmp_path: Path, database_url: str, temporal_address: str, sdk_port: int) -> WorkerProcess:
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    metrics_port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SWITCHBOARD_HOME": str(tmp_path / "home"),
        "SWITCHBOARD_DATABASE_URL": database_url,
        "SWITCHBOARD_TEMPORAL_ADDRESS": temporal_address,
        "SWITCHBOARD_TASK_QUEUE": task_queue,
        "SWITCHBOARD_ADMIN_TOKEN": "sba_" + secrets.token_hex(8),
        "SWITCHBOARD_SECRET_KEY": secrets.token_hex(32),
        "SWITCHBOARD_WORKER_METRICS_PORT": str(metrics_port),
        "SWITCHBOARD_TEMPORAL_METRICS_PORT": str(sdk_port),
    }
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(BIN / "switchboard"), "worker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: the sandbox children go with it
        )
    return WorkerProcess(proc, log, task_queue, metrics_port, sdk_port)


def stop(worker: WorkerProcess) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.proc.pid, signal.SIGINT)
    try:
        worker.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()


@contextlib.contextmanager
def running_worker(tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment) -> Iterator[WorkerProcess]:
    address = temporal_env.client.service_client.config.target_host
    worker = start_worker(tmp_path, database_url, address, free_port())
    try:
        yield worker
    finally:
        stop(worker)


def dashboard_temporal_series() -> set[str]:
    """The Temporal SDK families the shipped dashboard queries (histograms by their family name)."""
    exprs = " ".join(t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", []))
    return {name.removesuffix("_bucket") for name in re.findall(r"\btemporal_[a-z_]+", exprs)}


async def test_a_worker_serves_its_registry_and_the_sdk_serves_its_metrics_on_their_own_port(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    client: Client = temporal_env.client
    with running_worker(tmp_path, database_url, temporal_env) as worker:
        try:
            async with httpx.AsyncClient(timeout=10) as http:

                async def scrape(port: int) -> str | None:
                    assert worker.proc.poll() is None, worker.log.read_text()
                    with contextlib.suppress(httpx.TransportError):
                        resp = await http.get(f"http://127.0.0.1:{port}/metrics")
                        return resp.text if resp.status_code == 200 else None
                    return None

                registry = await eventually(lambda: scrape(worker.metrics_port), timeout=120)
                assert "switchboard_ingest_requests" in registry  # the same registry as the API's /metrics
                assert "temporal_" not in registry  # the SDK's series are the SDK's exporter's alone
                # The suite's client starts a workflow the worker process runs.
                result = await client.execute_workflow(
                    ReapTodos.run, UpkeepInput(), id=f"reap-{uuid.uuid4().hex}", task_queue=worker.task_queue
                )
                assert isinstance(result, UpkeepResult)

                def completed(text: str) -> float:
                    for family in text_string_to_metric_families(text):
                        for sample in family.samples:
                            if (
                                sample.name == "temporal_workflow_completed_total"
                                and sample.labels.get("workflow_type") == "ReapTodos"
                                and sample.labels.get("task_queue") == worker.task_queue
                            ):
                                return sample.value
                    return 0.0

                async def after_run() -> str | None:
                    got = await scrape(worker.sdk_port)
                    return got if got is not None and completed(got) >= 1 else None

                text = await eventually(after_run, timeout=60)
        finally:
            for schedule_id in schedule_ids(worker.task_queue).values():
                with contextlib.suppress(Exception):
                    await client.get_schedule_handle(schedule_id).delete()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        latency = families["temporal_workflow_endtoend_latency_seconds"]
        assert latency.type == "histogram"
        assert any(s.name.endswith("_bucket") and s.labels.get("le") == "+Inf" for s in latency.samples)
        assert families["temporal_worker_task_slots_available"].type == "gauge"
        assert families["temporal_request"].type == "counter"
        assert any(s.name == "temporal_request_total" for s in families["temporal_request"].samples)
        # What the dashboard queries exists under those names (a failure count appears with the first failure).
        exported = {f"{name}_total" if f.type == "counter" else name for name, f in families.items()}
        assert dashboard_temporal_series() - {"temporal_workflow_failed_total"} <= exported
    # Both listeners are gone with the process.
    assert not listening(worker.metrics_port) and not listening(worker.sdk_port)


def test_a_temporal_metrics_port_the_worker_cannot_bind_refuses_to_start(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = temporal_env.client.service_client.config.target_host
        worker = start_worker(tmp_path, database_url, address, taken.getsockname()[1])
        try:
            returncode = worker.proc.wait(timeout=120)
        finally:
            if worker.proc.poll() is None:
                stop(worker)
    assert returncode != 0
    log = worker.log.read_text()
    assert f"SWITCHBOARD_TEMPORAL_METRICS_PORT: cannot serve on 127.0.0.1:{worker.sdk_port}" in log, log[-2000:]
    assert "Address already in use" in log
