"""Sealed payloads end to end: the API seals, the worker with the key opens, /codec serves the UI and the CLI."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from api.codec_endpoint import COOKIE
from routing.delivery import DeliveryInput, workflow_id_for
from store.db import open_pool
from switchboard.payload_codec import ENCODING
from switchboard.temporal import data_converter
from tests.conftest import Stack, running_stack
from tests.helpers import eventually, issue_payload, post_github
from worker import build_worker

MARK = "sealed-marker-title"
UI = "http://localhost:8233"


@pytest.fixture
async def sealed(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> AsyncIterator[Stack]:
    async with running_stack(
        tmp_path, database_url, temporal_env.client, sandbox, payload_key=secrets.token_hex(32)
    ) as s:
        yield s


def _admin(stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.settings.admin_token}"}


async def _start_input(env: WorkflowEnvironment, webhook: dict[str, Any], delivery: str) -> Payloads:
    """The run's recorded input as the server holds it (read with a client that has no key)."""
    workflow_id = workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:{delivery}")
    history = await env.client.get_workflow_handle(workflow_id).fetch_history()
    assert MARK.encode() not in b"".join(e.SerializeToString() for e in history.events)
    return history.events[0].workflow_execution_started_event_attributes.input


async def test_the_worker_with_the_key_routes_what_the_api_sealed_and_the_codec_reads_it(
    sealed: Stack, temporal_env: WorkflowEnvironment
) -> None:
    agent = await sealed.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rules = [{"id": "mark", "expr": f'.payload.issue.title == "{MARK}"', "action": {"queue": "work"}}]
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    resp = await post_github(sealed.http, webhook, issue_payload(title=MARK), delivery="sealed-1")
    assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
    [(rule_id,)] = sealed.sql("SELECT routing_trace->>'rule_id' FROM events WHERE id = %s", resp.json()["event_id"])
    assert rule_id == "mark"  # the evaluate activity opened the sealed start event too

    recorded = await _start_input(temporal_env, webhook, "sealed-1")
    assert [p.metadata["encoding"] for p in recorded.payloads] == [ENCODING]
    request = json_format.MessageToDict(recorded)
    opened = await sealed.http.post("/codec/decode", json=request, headers=_admin(sealed))
    assert opened.status_code == 200, opened.text
    [payload] = json_format.ParseDict(opened.json(), Payloads()).payloads
    assert payload.metadata["encoding"] == b"json/plain"
    assert MARK.encode() in DeliveryInput.model_validate_json(payload.data).body

    # encode then decode over HTTP gives the payload back.
    sealed_again = await sealed.http.post("/codec/encode", json=opened.json(), headers=_admin(sealed))
    assert sealed_again.status_code == 200 and MARK not in sealed_again.text
    back = await sealed.http.post("/codec/decode", json=sealed_again.json(), headers=_admin(sealed))
    assert back.json() == opened.json()

    # Tampered: a clear error, nothing opened.
    tampered = json_format.ParseDict(request, Payloads())
    tampered.payloads[0].data = tampered.payloads[0].data[:-1] + bytes([tampered.payloads[0].data[-1] ^ 1])
    refused = await sealed.http.post("/codec/decode", json=json_format.MessageToDict(tampered), headers=_admin(sealed))
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_argument"
    assert "does not authenticate" in refused.json()["error"]["message"]


async def test_the_codec_endpoint_needs_the_admin_token_and_an_allowed_origin(sealed: Stack) -> None:
    body: dict[str, list[Any]] = {"payloads": []}
    assert (await sealed.http.post("/codec/decode", json=body)).status_code == 401
    wrong = {"Authorization": "Bearer sba_wrong"}
    assert (await sealed.http.post("/codec/decode", json=body, headers=wrong)).status_code == 401
    assert (await sealed.http.post("/codec/decode", json=body, headers=_admin(sealed))).json() == {"payloads": []}
    bad = await sealed.http.post("/codec/decode", content=b"[1]", headers=_admin(sealed))
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_argument"

    # Browsers: the configured UI origin only (default: the local Temporal UI), with credentials.
    preflight = {"Origin": UI, "Access-Control-Request-Method": "POST"}
    ok = await sealed.http.options("/codec/decode", headers=preflight)
    assert ok.status_code == 204 and ok.headers["access-control-allow-origin"] == UI
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert "authorization" in ok.headers["access-control-allow-headers"]
    evil = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    refused = await sealed.http.options("/codec/decode", headers=evil)
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    # A forged Origin with the token is refused too (not only by the browser).
    forged = await sealed.http.post(
        "/codec/decode", json=body, headers={**_admin(sealed), "Origin": "https://evil.example"}
    )
    assert forged.status_code == 403 and "access-control-allow-origin" not in forged.headers
    from_ui = await sealed.http.post("/codec/decode", json=body, headers={**_admin(sealed), "Origin": UI})
    assert from_ui.status_code == 200 and from_ui.headers["access-control-allow-origin"] == UI
    no_token = await sealed.http.post("/codec/decode", json=body, headers={"Origin": UI})
    assert no_token.status_code == 401 and no_token.headers["access-control-allow-origin"] == UI


async def test_a_browser_signs_in_with_the_admin_token_and_decodes_with_the_cookie(sealed: Stack) -> None:
    assert "admin_token" in (await sealed.http.get("/codec/login")).text
    denied = await sealed.http.post("/codec/login", data={"admin_token": "sba_wrong"})
    assert denied.status_code == 401 and COOKIE not in denied.cookies
    signed = await sealed.http.post("/codec/login", data={"admin_token": sealed.settings.admin_token or ""})
    assert signed.status_code == 200
    cookie = signed.cookies[COOKIE]
    assert cookie != sealed.settings.admin_token
    header = signed.headers["set-cookie"].lower()
    assert "httponly" in header and "samesite=strict" in header and "path=/codec" in header
    sealed.http.cookies.clear()
    answer = await sealed.http.post(
        "/codec/decode", json={"payloads": []}, headers={"Origin": UI, "Cookie": f"{COOKIE}={cookie}"}
    )
    assert answer.status_code == 200
    forged = await sealed.http.post("/codec/decode", json={"payloads": []}, headers={"Cookie": f"{COOKIE}=00"})
    assert forged.status_code == 401


async def test_without_a_payload_key_there_is_no_codec(stack: Stack) -> None:
    resp = await stack.http.post("/codec/decode", json={"payloads": []}, headers=_admin(stack))
    assert resp.status_code == 404 and "SWITCHBOARD_PAYLOAD_KEY" in resp.json()["error"]["message"]


async def test_a_worker_with_another_key_fails_closed_and_stores_nothing(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any
) -> None:
    key = secrets.token_hex(32)
    async with running_stack(
        tmp_path, database_url, temporal_env.client, sandbox, with_worker=False, payload_key=key
    ) as api:
        api.settings.ingest_wait_seconds = 0.5
        agent = await api.agent()
        webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
        resp = await post_github(api.http, webhook, issue_payload(title=MARK), delivery="keyless-1")
        assert resp.status_code == 202 and resp.json()["pending"] is True
        pool = await open_pool(database_url, max_size=2)
        try:
            # This worker holds another key: it cannot open the sealed input.
            other = api.settings.model_copy(update={"payload_key": secrets.token_hex(32)})
            client = Client(
                temporal_env.client.service_client, namespace="default", data_converter=data_converter(other)
            )
            worker = build_worker(client, pool, api.settings, task_queue=api.settings.task_queue, sandbox=sandbox)
            async with worker:
                handle = temporal_env.client.get_workflow_handle(resp.json()["workflow_id"])

                async def task_failed() -> str | None:
                    for e in (await handle.fetch_history()).events:
                        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                            failure = e.workflow_task_failed_event_attributes.failure
                            return f"{failure.message}: {failure.cause.message}"
                    return None

                message = await eventually(task_failed, timeout=60)
        finally:
            await pool.close()
        assert "SWITCHBOARD_PAYLOAD_KEY" in message
        assert api.sql("SELECT count(*) FROM events")[0][0] == 0
