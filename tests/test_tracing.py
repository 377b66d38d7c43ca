"""Tracing (switchboard/tracing.py) and Temporal core's log lines, in real `switchboard api` and `switchboard worker`
processes exporting to an in-process OTLP collector.

The collector is a fake of something outside the product: a tiny HTTP receiver that decodes each OTLP/HTTP export
request with opentelemetry-proto and keeps its spans. The processes use the suite's PostgreSQL and Temporal.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from psycopg import sql
from temporalio.testing import WorkflowEnvironment

from routing.delivery import workflow_id_for
from tests.conftest import Agent, Stack
from tests.helpers import eventually, issue_payload, post_github, token_of

BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.timeout(600)]

SERVER, CLIENT = ProtoSpan.SPAN_KIND_SERVER, ProtoSpan.SPAN_KIND_CLIENT


@dataclass(frozen=True)
class Exported:
    """One span as the collector received it."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    service: str
    attributes: dict[str, Any]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which else None


@dataclass
class Collector:
    """An OTLP/HTTP trace receiver on a free localhost port."""

    spans: list[Exported] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    endpoint: str = ""

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got: list[Exported] = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append(
                        Exported(
                            name=span.name,
                            kind=span.kind,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            service=str(resource.get("service.name")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self.lock:
            self.bodies.append(body)
            self.spans.extend(got)

    def snapshot(self) -> list[Exported]:
        with self.lock:
            return list(self.spans)


@contextlib.contextmanager
def collecting() -> Iterator[Collector]:
    collector = Collector()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                collector.receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    collector.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Processes:
    """A `switchboard api` and a `switchboard worker`, tracing to the collector."""

    collector: Collector
    base_url: str
    admin_token: str
    worker_log: Path
    api_log: Path

    def logs(self) -> str:
        return f"--- api\n{self.api_log.read_text()}\n--- worker\n{self.worker_log.read_text()}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)  # its own group (start_new_session): the sandbox children too
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def processes(
    tmp_path_factory: pytest.TempPathFactory, pg_server: Any, template_db: str, temporal_env: WorkflowEnvironment
) -> Iterator[Processes]:
    root = tmp_path_factory.mktemp("tracing")
    name = f"sb_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template_db))
        )
    port = free_port()
    admin_token = "sba_" + secrets.token_hex(8)
    base = {
        "PATH": os.environ.get("PATH", ""),
        "SWITCHBOARD_DATABASE_URL": pg_server.get_uri(name),
        "SWITCHBOARD_TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "SWITCHBOARD_TASK_QUEUE": f"tq-{uuid.uuid4().hex[:10]}",
        "SWITCHBOARD_ADMIN_TOKEN": admin_token,
        "SWITCHBOARD_SECRET_KEY": secrets.token_hex(32),
        "SWITCHBOARD_API_WORKER": "false",
        "SWITCHBOARD_HTTP_PORT": str(port),
        "SWITCHBOARD_INGEST_WAIT_SECONDS": "60",
        "SWITCHBOARD_INGEST_RATE_PER_SECOND": "0",
        "SWITCHBOARD_AUTHORING_RATE_PER_SECOND": "0",
        "SWITCHBOARD_WEBHOOK_ADMIN_RATE_PER_SECOND": "0",
        # Off in the test process; on in these two, by the standard variables only.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with collecting() as collector, contextlib.ExitStack() as stack:
        base["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
        started: list[subprocess.Popen[bytes]] = []
        logs: dict[str, Path] = {}
        # The worker logs at debug: Temporal core's own lines (forwarded at debug) are part of its stream.
        for role, level in (("worker", "debug"), ("api", "info")):
            logs[role] = root / f"{role}.log"
            env = base | {"SWITCHBOARD_HOME": str(root / role), "SWITCHBOARD_LOG_LEVEL": level}
            with logs[role].open("ab") as out:
                proc = subprocess.Popen(
                    [str(BIN / "switchboard"), role],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            started.append(proc)
            stack.callback(_stop, proc)
        found = Processes(collector, f"http://127.0.0.1:{port}", admin_token, logs["worker"], logs["api"])
        deadline = time.monotonic() + 120
        while True:
            for proc in started:
                assert proc.poll() is None, found.logs()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(found.base_url + "/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the API did not become healthy:\n" + found.logs()
            time.sleep(0.2)
        yield found
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
async def remote(processes: Processes) -> AsyncIterator[Stack]:
    """The admin and agent helpers, over HTTP to the API process."""
    from switchboard.settings import Settings

    async with httpx.AsyncClient(base_url=processes.base_url, timeout=90) as http:
        settings = Settings(admin_token=processes.admin_token)
        yield Stack(settings, http, None, "")  # type: ignore[arg-type]


def _ancestors(span: Exported, by_id: dict[str, Exported]) -> list[str]:
    names = []
    seen = span
    while seen.parent_id and seen.parent_id in by_id:
        seen = by_id[seen.parent_id]
        names.append(seen.name)
    return names


async def test_one_trace_runs_from_the_ingest_post_through_the_workflow_and_activities_to_the_commit_sql(
    processes: Processes, remote: Stack
) -> None:
    agent: Agent = await remote.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rule = {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": [rule]})
    delivery = str(uuid.uuid4())
    resp = await post_github(remote.http, webhook, issue_payload(), delivery=delivery)
    assert resp.status_code == 202, resp.text + processes.logs()
    assert resp.json().get("pending") is not True, resp.text  # the run finished within the request
    workflow_id = workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:{delivery}")

    def post_span() -> Exported | None:
        for span in processes.collector.snapshot():
            if span.name == "POST /webhooks/w/{ingest_token}" and span.kind == SERVER:
                return span
        return None

    post = await eventually(post_span, timeout=60)
    assert post.service == "switchboard-api"
    wanted = {
        ("StartWorkflow:RouteDelivery", CLIENT, "switchboard-api"),
        ("RunWorkflow:RouteDelivery", SERVER, "switchboard-worker"),
        ("StartActivity:load_grant", CLIENT, "switchboard-worker"),
        ("RunActivity:load_grant", SERVER, "switchboard-worker"),
        # The default evaluate path on an idle worker: the fast path's local activity (a queued evaluation is
        # the regular evaluate_rules activity, traced the same way).
        ("StartActivity:evaluate_rules_if_free", CLIENT, "switchboard-worker"),
        ("RunActivity:evaluate_rules_if_free", SERVER, "switchboard-worker"),
        ("StartActivity:commit_delivery", CLIENT, "switchboard-worker"),
        ("RunActivity:commit_delivery", SERVER, "switchboard-worker"),
    }

    def whole_trace() -> list[Exported] | None:
        spans = [s for s in processes.collector.snapshot() if s.trace_id == post.trace_id]
        have = {(s.name, s.kind, s.service) for s in spans}
        commit_sql = [s for s in spans if "INSERT INTO events" in str(s.attributes.get("db.statement", ""))]
        return spans if wanted <= have and commit_sql else None

    spans = await eventually(whole_trace, timeout=60)
    by_id = {s.span_id: s for s in spans}
    start = next(s for s in spans if s.name == "StartWorkflow:RouteDelivery")
    assert start.attributes["temporalWorkflowID"] == workflow_id
    assert "POST /webhooks/w/{ingest_token}" in _ancestors(start, by_id)
    run = next(s for s in spans if s.name == "RunWorkflow:RouteDelivery")
    assert run.attributes["temporalWorkflowID"] == workflow_id
    assert _ancestors(run, by_id)[:1] == ["StartWorkflow:RouteDelivery"]
    # The commit's SQL, a child of the local activity that ran it, in the worker process, inside the one trace.
    insert = next(s for s in spans if "INSERT INTO events" in str(s.attributes.get("db.statement", "")))
    assert insert.service == "switchboard-worker" and insert.kind == CLIENT
    assert insert.attributes.get("db.system") == "postgresql"
    chain = _ancestors(insert, by_id)
    assert chain[0] == "RunActivity:commit_delivery", chain
    assert chain[-1] == "POST /webhooks/w/{ingest_token}", chain
    assert "StartActivity:commit_delivery" in chain and "StartWorkflow:RouteDelivery" in chain
    # The API's own statements (the webhook lookup) are in the same trace, under the request.
    api_sql = [s for s in spans if s.service == "switchboard-api" and s.attributes.get("db.system") == "postgresql"]
    assert api_sql
    # The ingest path's credential never reaches the collector; parameters are never captured.
    token = token_of(webhook["ingest_url"])
    with processes.collector.lock:
        assert not [body for body in processes.collector.bodies if token.encode() in body]
    assert all("db.statement.parameters" not in s.attributes for s in spans)


def test_worker_stream_is_json_with_temporal_core_lines_forwarded(processes: Processes) -> None:
    def core_lines() -> list[dict[str, Any]] | None:
        lines = [json.loads(line) for line in processes.worker_log.read_text().splitlines() if line.startswith("{")]
        core = [line for line in lines if line["logger"] == "temporalio.core"]
        return core or None

    core = eventually_sync(core_lines)
    assert all(line.get("core_target") for line in core), core[:3]
    assert any(str(line["core_target"]).startswith("temporal") for line in core)
    text = processes.worker_log.read_text()
    assert "\x1b[" not in text  # no colour codes: core no longer writes to the console itself
    for line in text.splitlines():
        assert line.startswith("{") and isinstance(json.loads(line), dict), line


def eventually_sync(probe: Any, timeout: float = 60.0) -> Any:
    """`eventually` for a synchronous test: poll, never sleep a fixed time for a condition."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


@pytest.fixture
def untraced(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL endpoint in this process's environment, whatever the developer's shell has."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)


async def test_without_an_otlp_endpoint_nothing_is_installed(untraced: None, tmp_path: Path, stack: Stack) -> None:
    import psycopg as psycopg_module
    from opentelemetry import trace
    from temporalio.contrib.opentelemetry import TracingInterceptor

    from switchboard import tracing
    from switchboard.request_ids import RequestIdInterceptor
    from switchboard.temporal import connect

    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await post_github(stack.http, webhook, issue_payload())
    assert resp.status_code == 202, resp.text

    assert not tracing.wanted() and tracing.installed() is None and not tracing.install(tracing.API)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # no provider was ever set
    assert not getattr(stack.app, "_is_instrumented_by_opentelemetry", False)  # no FastAPI middleware
    assert not hasattr(psycopg_module.AsyncConnection.connect, "__wrapped__")  # psycopg untouched
    client = await connect(stack.settings)
    kinds = [type(i) for i in client.config()["interceptors"]]
    assert kinds == [RequestIdInterceptor] and TracingInterceptor not in kinds
    assert tracing.interceptors() == []


@pytest.mark.parametrize("passthrough", [True, False], ids=["worker-sandbox", "default-sandbox"])
async def test_committed_histories_replay_with_the_tracing_and_request_id_interceptors(passthrough: bool) -> None:
    """The interceptors' workflow parts run inside the sandbox (the worker's, and the SDK's stricter default) and
    change no command: every committed history replays with them installed."""
    from temporalio.contrib.opentelemetry import TracingInterceptor
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    from switchboard.request_ids import RequestIdInterceptor
    from tests.workflows.replay import committed, committed_names
    from worker import WORKFLOWS

    restrictions = SandboxRestrictions.default
    if passthrough:
        restrictions = restrictions.with_passthrough_all_modules()
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[RequestIdInterceptor(), TracingInterceptor(always_create_workflow_spans=True)],
        workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
    )
    names = committed_names()
    assert names
    for name in names:
        await replayer.replay_workflow(committed(name))
