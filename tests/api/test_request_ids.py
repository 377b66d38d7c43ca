"""X-Request-Id: honoured when plain, replaced when not, echoed, and on every log line of the request, its
workflow and its activities (switchboard/request_ids.py)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from switchboard.logs import JsonFormatter
from switchboard.request_ids import HEADER, MAX_LENGTH, accepted_request_id
from switchboard.temporal import connect
from tests.conftest import Stack, make_settings, running_stack
from tests.helpers import eventually, issue_payload, post_github, token_of
from tests.workflows.replay import handle_for

LOGGERS = ("switchboard", "temporalio.workflow", "temporalio.activity")


@pytest.fixture
async def traced_stack(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> AsyncIterator[Stack]:
    """The stack on a client made the product's way (switchboard/temporal.py: its interceptors included)."""
    address = temporal_env.client.service_client.config.target_host
    client = await connect(make_settings(tmp_path, database_url, address, "unused"))
    async with running_stack(tmp_path, database_url, client, sandbox) as stack:
        yield stack


def json_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """Every captured record as the production formatter prints it."""
    formatter = JsonFormatter()
    return [json.loads(formatter.format(record)) for record in caplog.records]


def test_accepted_request_id_keeps_plain_ids_and_replaces_anything_else() -> None:
    for plain in ("abc123", str(uuid.uuid4()), "req-1.2:3_x", "dGVzdA+/=", "a" * MAX_LENGTH):
        assert accepted_request_id(plain) == plain
    for bad in (None, "", "a" * (MAX_LENGTH + 1), "has space", "new\nline", 'quote"', "ünï", "semi;colon", "<x>"):
        replaced = accepted_request_id(bad)
        assert replaced != bad and len(replaced) == 16 and int(replaced, 16) >= 0


async def test_inbound_request_id_is_echoed_and_on_every_line_of_the_request_its_workflow_and_activities(
    traced_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = traced_stack
    for name in LOGGERS:
        caplog.set_level(logging.INFO, logger=name)
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})

    routed_id = f"producer-{uuid.uuid4()}"
    delivery = str(uuid.uuid4())
    resp = await post_github(
        stack.http, webhook, issue_payload(), delivery=delivery, extra_headers={"X-Request-Id": routed_id}
    )
    assert resp.status_code == 202, resp.text
    assert resp.headers["x-request-id"] == routed_id
    handle = handle_for(stack, webhook["webhook_id"], delivery)
    workflow_id = handle.id

    def lines_of(request_id: str) -> list[dict[str, Any]]:
        return [line for line in json_lines(caplog) if line.get("request_id") == request_id]

    def routed_lines() -> list[dict[str, Any]] | None:
        lines = lines_of(routed_id)
        loggers = {line["logger"] for line in lines}
        wanted = {"switchboard.http", "temporalio.workflow", "temporalio.activity"}
        return lines if wanted <= loggers else None

    lines = await eventually(routed_lines)
    access = [line for line in lines if line["logger"] == "switchboard.http"]
    assert [line["message"] for line in access] == ["request"]
    assert access[0]["path"] == "/webhooks/w/«token»" and access[0]["status"] == 202
    decided = [line for line in lines if line["logger"] == "temporalio.workflow"]
    assert decided and decided[0]["message"].startswith("delivery decided: routed")
    assert decided[0]["temporal_workflow"]["workflow_id"] == workflow_id  # the SDK logger's own context
    committed = [line for line in lines if line["logger"] == "temporalio.activity"]
    assert committed and committed[0]["message"].startswith("delivery committed: routed")
    assert committed[0]["temporal_activity"]["activity_type"] == "commit_delivery"
    assert committed[0]["temporal_activity"]["workflow_id"] == workflow_id
    # The id travelled in the start's header, where the UI and `temporal workflow show` see it too.
    history = await handle.fetch_history()
    start_event = history.events[0].workflow_execution_started_event_attributes
    assert HEADER in start_event.header.fields

    # A rejected delivery: its warning carries the caller's id too.
    rejected_id = f"rejected-{uuid.uuid4().hex}"
    resp = await post_github(
        stack.http, webhook, issue_payload(), secret="not-the-secret", extra_headers={"X-Request-Id": rejected_id}
    )
    assert resp.status_code == 401
    assert resp.headers["x-request-id"] == rejected_id
    rejected = [line["message"] for line in lines_of(rejected_id)]
    assert "delivery rejected" in rejected and "request" in rejected
    # Nothing of one request carries another's id.
    assert not [line for line in lines_of(rejected_id) if line["logger"].startswith("temporalio")]
    assert all(
        line.get("request_id") != routed_id for line in json_lines(caplog) if line["message"] == "delivery rejected"
    )


async def test_invalid_request_id_is_replaced_and_the_replacement_is_what_the_lines_carry(
    traced_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = traced_stack
    caplog.set_level(logging.INFO, logger="switchboard")
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    for bad in ("x" * (MAX_LENGTH + 1), "two words", "sbk_" + "a" * 20 + ";drop"):
        resp = await post_github(
            stack.http, webhook, issue_payload(), secret="wrong", extra_headers={"X-Request-Id": bad}
        )
        assert resp.status_code == 401
        echoed = resp.headers["x-request-id"]
        assert echoed != bad and len(echoed) == 16
        lines = [line for line in json_lines(caplog) if line.get("request_id") == echoed]
        assert {line["message"] for line in lines} >= {"delivery rejected", "request"}
        assert not [line for line in json_lines(caplog) if bad in json.dumps(line)]
    # Without one, every response still has a fresh id.
    resp = await stack.http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=b"{}")
    assert len(resp.headers["x-request-id"]) == 16
    ok = await stack.http.get("/healthz", headers={"X-Request-Id": "probe-1"})
    assert ok.headers["x-request-id"] == "probe-1" and ok.headers.get_list("x-request-id") == ["probe-1"]


def test_a_header_written_by_another_client_binds_only_a_plain_id() -> None:
    from temporalio.api.common.v1 import Payload

    from switchboard.request_ids import _request_id_from, _with_request_id

    assert _request_id_from(_with_request_id({}, "abc-1")) == "abc-1"
    assert _with_request_id({}, None) == {}
    for forged in (
        Payload(metadata={"encoding": b"json/plain"}, data=b'"two words"'),
        Payload(metadata={"encoding": b"json/plain"}, data=b'{"not": "a string"}'),
        Payload(metadata={"encoding": b"json/plain"}, data=b"\xff\xfe"),
        Payload(metadata={"encoding": b"binary/plain"}, data=b"abc"),
    ):
        assert _request_id_from({HEADER: forged}) is None
