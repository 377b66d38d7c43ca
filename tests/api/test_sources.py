"""Stripe, Slack, Cairn (and the forges) through the real receiver: every signature verdict, end to end."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from psycopg.types.json import Jsonb

from routing.delivery import workflow_id_for
from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, token_of
from tests.signing import sign_cairn, sign_gitea, sign_github, sign_slack, sign_stripe

WRONG = b"whsec_" + b"0" * 64


async def _post(stack: Stack, webhook: dict[str, Any], body: bytes, headers: dict[str, str]) -> httpx.Response:
    all_headers = {"Content-Type": "application/json", **headers}
    return await stack.http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=body, headers=all_headers)


async def _webhook(agent: Agent, source: str, queue: str = "work") -> dict[str, Any]:
    return await agent.ok("create_webhook", {"source_type": source, "target_queue": queue})


def _counts(stack: Stack) -> tuple[int, int]:
    return stack.sql("SELECT count(*) FROM events")[0][0], stack.sql("SELECT count(*) FROM todos")[0][0]


def _rfc3339(offset_s: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset_s)).isoformat().replace("+00:00", "Z")


# --- Stripe -------------------------------------------------------------------------------------------------


def _stripe_body(event_id: str = "evt_1") -> bytes:
    return json.dumps({"id": event_id, "type": "invoice.paid", "data": {"object": {"id": "in_1"}}}).encode()


async def test_stripe_valid_invalid_expired_future_and_replayed(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "stripe")
    secret = webhook["secret"].encode()
    body = _stripe_body("evt_ok")
    now = int(time.time())

    ok = await _post(stack, webhook, body, sign_stripe(secret, body, now))
    assert ok.status_code == 202, ok.text
    assert ok.json()["created"] == 1 and ok.json()["verified"] is True
    [(ext, kind)] = stack.sql("SELECT external_id, kind FROM events WHERE id = %s", ok.json()["event_id"])
    assert ext == f"{webhook['webhook_id']}:evt_ok" and kind == "invoice.paid"  # the signed event's type

    for headers in (
        sign_stripe(WRONG, body, now),  # invalid
        sign_stripe(secret, body, now - 301),  # expired
        sign_stripe(secret, body, now + 301),  # future-dated
        {"stripe-signature": f"t={now}"},  # no v1
        {},  # unsigned
    ):
        bad = await _post(stack, webhook, _stripe_body("evt_bad"), headers)
        assert bad.status_code == 401, headers
        assert bad.json() == {"error": "signature verification failed"}

    # A captured delivery replayed verbatim inside the window is the same event: nothing new is minted.
    replayed = await _post(stack, webhook, body, sign_stripe(secret, body, now))
    assert replayed.status_code == 202 and replayed.json()["duplicate"] is True and replayed.json()["created"] == 0
    assert _counts(stack) == (1, 1)


async def test_stripe_secret_rotation_accepts_either_v1(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "stripe")
    secret = webhook["secret"].encode()
    now = int(time.time())
    for n, order in enumerate(("new-first", "old-first")):
        body = _stripe_body(f"evt_rot_{n}")
        good = sign_stripe(secret, body, now)["stripe-signature"].split(",v1=")[1]
        old = sign_stripe(WRONG, body, now)["stripe-signature"].split(",v1=")[1]
        pair = (good, old) if order == "new-first" else (old, good)
        resp = await _post(stack, webhook, body, {"Stripe-Signature": f"t={now},v1={pair[0]},v1={pair[1]}"})
        assert resp.status_code == 202 and resp.json()["created"] == 1, resp.text
    neither = _stripe_body("evt_rot_x")
    bad = sign_stripe(WRONG, neither, now)["stripe-signature"]
    resp = await _post(stack, webhook, neither, {"Stripe-Signature": bad + ",v1=" + "ab" * 32})
    assert resp.status_code == 401


async def _run_of(stack: Stack, webhook: dict[str, Any], external: str) -> tuple[str | None, Any]:
    """The delivery run's summary line and its SwitchboardKind search attribute."""
    handle = stack.temporal.get_workflow_handle(
        workflow_id_for(webhook["webhook_id"], f"{webhook['webhook_id']}:{external}")
    )
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    return await desc.static_summary(), attrs.get("SwitchboardKind")


async def test_a_body_kinded_delivery_takes_its_kind_from_the_signed_body_never_a_header(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "payments", "mentions"])
    stripe = await _webhook(agent, "stripe")
    slack = await _webhook(agent, "slack")
    rules = [
        {"id": "paid", "expr": '.kind == "payment_intent.succeeded"', "action": {"queue": "payments"}},
        {"id": "mention", "expr": '.kind == "app_mention"', "action": {"queue": "mentions"}},
        {"id": "header", "expr": '.kind == "issues"', "action": {"drop": True}},
    ]
    for webhook in (stripe, slack):
        await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    now = int(time.time())
    forged = {"X-GitHub-Event": "issues", "X-Cairn-Event": "artifact.created"}  # unsigned: never a kind

    paid = json.dumps({"id": "evt_paid", "type": "payment_intent.succeeded", "data": {"object": {}}}).encode()
    resp = await _post(stack, stripe, paid, {**sign_stripe(stripe["secret"].encode(), paid, now), **forged})
    assert resp.status_code == 202 and [t["queue"] for t in resp.json()["todos"]] == ["payments"], resp.text
    mention = json.dumps({"type": "event_callback", "event_id": "EvM", "event": {"type": "app_mention"}}).encode()
    resp = await _post(stack, slack, mention, {**sign_slack(slack["secret"].encode(), mention, now), **forged})
    assert resp.status_code == 202 and [t["queue"] for t in resp.json()["todos"]] == ["mentions"], resp.text
    # A body without its type has no kind: the forged forge header does not stand in (default: the target queue).
    untyped = json.dumps({"id": "evt_untyped", "data": {}}).encode()
    resp = await _post(stack, stripe, untyped, {**sign_stripe(stripe["secret"].encode(), untyped, now), **forged})
    assert resp.status_code == 202 and [t["queue"] for t in resp.json()["todos"]] == ["work"], resp.text

    stored = dict(stack.sql("SELECT external_id, kind FROM events"))
    assert stored == {
        f"{stripe['webhook_id']}:evt_paid": "payment_intent.succeeded",
        f"{slack['webhook_id']}:EvM": "app_mention",
        f"{stripe['webhook_id']}:evt_untyped": None,
    }
    assert sorted(r[0] or "" for r in stack.sql("SELECT kind FROM todos")) == [
        "",
        "app_mention",
        "payment_intent.succeeded",
    ]
    # The Temporal UI's summary line and the SwitchboardKind search attribute carry the same kind.
    assert await _run_of(stack, stripe, "evt_paid") == ("stripe payment_intent.succeeded", "payment_intent.succeeded")
    assert await _run_of(stack, slack, "EvM") == ("slack app_mention", "app_mention")
    assert await _run_of(stack, stripe, "evt_untyped") == ("stripe", None)


# --- Slack --------------------------------------------------------------------------------------------------


def _slack_body(event_id: str = "Ev1") -> bytes:
    return json.dumps(
        {"type": "event_callback", "event_id": event_id, "event": {"type": "app_mention", "text": "hi"}}
    ).encode()


async def test_slack_valid_invalid_expired_future_and_replayed(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "slack")
    secret = webhook["secret"].encode()
    body = _slack_body("EvOK")
    now = int(time.time())

    ok = await _post(stack, webhook, body, sign_slack(secret, body, now))
    assert ok.status_code == 202 and ok.json()["created"] == 1, ok.text
    [(ext,)] = stack.sql("SELECT external_id FROM events WHERE id = %s", ok.json()["event_id"])
    assert ext == f"{webhook['webhook_id']}:EvOK"

    stale = sign_slack(secret, body, now - 301)
    for headers in (
        sign_slack(WRONG, body, now),
        stale,
        sign_slack(secret, body, now + 301),
        {"x-slack-signature": stale["x-slack-signature"]},  # no timestamp
        {},
    ):
        bad = await _post(stack, webhook, _slack_body("EvBad"), headers)
        assert bad.status_code == 401, headers

    replayed = await _post(stack, webhook, body, sign_slack(secret, body, now))
    assert replayed.json()["duplicate"] is True
    assert _counts(stack) == (1, 1)


async def test_slack_url_verification_answers_the_challenge_and_mints_nothing(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "slack")
    secret = webhook["secret"].encode()
    body = json.dumps(
        {
            "token": "legacy",
            "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
            "type": "url_verification",
        }
    ).encode()

    resp = await _post(stack, webhook, body, sign_slack(secret, body, int(time.time())))
    assert resp.status_code == 200
    assert resp.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}
    # The handshake is signed like any delivery: an unsigned one proves nothing and is refused.
    unsigned = await _post(stack, webhook, body, {})
    assert unsigned.status_code == 401
    assert _counts(stack) == (0, 0)
    # By workflow id, which a run has from its start (its search attributes come only when it decides).
    query = f"WorkflowId STARTS_WITH 'delivery-{webhook['webhook_id']}-'"
    running = [w async for w in stack.temporal.list_workflows(query)]
    assert running == []


# --- Cairn --------------------------------------------------------------------------------------------------


def _cairn_body(event_id: str = "ce_1", created_at: str | None = None, **data: Any) -> bytes:
    doc: dict[str, Any] = {
        "event_id": event_id,
        "kind": "artifact.created",
        "created_at": created_at or _rfc3339(),
        "data": {
            "id": "art_1",
            "url": "https://cairn.example/a/art_1",
            "title": "Handoff: fix flaky test",
            "share_type": "handoff",
            "actor_id": "agent-7",
            "on_behalf_of": "claude-code/1.0",
            "tags": ["handoff", "lane:m", 3],
            **data,
        },
    }
    return json.dumps(doc).encode()


def _set_rules(stack: Stack, webhook_id: str, rules: list[dict[str, Any]], default: Any = None) -> None:
    stack.sql(
        "UPDATE endpoint_webhooks SET routing_rules = %s, routing_default_action = %s WHERE id = %s",
        Jsonb(rules),
        Jsonb(default) if default is not None else None,
        webhook_id,
    )


async def test_cairn_kind_comes_from_the_signed_body_and_artifact_is_projected(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "lane-m"])
    webhook = await _webhook(agent, "cairn")
    secret = webhook["secret"].encode()
    # The rule reads only switchboard-derived fields: .kind, and the .artifact projection.
    expr = (
        '.kind == "artifact.created" and .artifact.handle == "mcp://cairn/art_1"'
        ' and (.artifact.tags | any(. == "lane:m")) and .artifact.on_behalf_of == "claude-code/1.0"'
        ' and .artifact.actor_id == "agent-7" and .artifact.event_id == "ce_forge"'
    )
    _set_rules(stack, webhook["webhook_id"], [{"id": "handoff", "expr": expr, "action": {"queue": "lane-m"}}])
    body = _cairn_body("ce_forge")
    headers = {**sign_cairn(secret, body), "X-Cairn-Event": "artifact.deleted", "X-Cairn-Event-Id": "ce_forge"}

    resp = await _post(stack, webhook, body, headers)
    assert resp.status_code == 202, resp.text
    [todo] = resp.json()["todos"]
    assert todo["queue"] == "lane-m"
    [(kind, ext, trace)] = stack.sql(
        "SELECT kind, external_id, routing_trace FROM events WHERE id = %s", resp.json()["event_id"]
    )
    assert kind == "artifact.created"  # the forged X-Cairn-Event header changed nothing
    assert ext == f"{webhook['webhook_id']}:ce_forge"
    assert trace["rule_id"] == "handoff"


async def test_cairn_rejections_and_replay(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, "cairn")
    secret = webhook["secret"].encode()
    body = _cairn_body("ce_ok")
    ok = await _post(stack, webhook, body, sign_cairn(secret, body))
    assert ok.status_code == 202 and ok.json()["created"] == 1

    mismatch = _cairn_body("ce_body")
    no_created = json.dumps({"event_id": "ce_x", "kind": "artifact.created", "data": {"id": "a"}}).encode()
    no_id = json.dumps({"kind": "artifact.created", "created_at": _rfc3339(), "data": {"id": "a"}}).encode()
    cases: list[tuple[bytes, dict[str, str]]] = [
        (mismatch, {**sign_cairn(secret, mismatch), "X-Cairn-Event-Id": "ce_header"}),  # header/body id mismatch
        (body, sign_cairn(WRONG, body)),  # invalid
        (_cairn_body("ce_old", _rfc3339(-301)), sign_cairn(secret, _cairn_body("ce_old", _rfc3339(-301)))),
        (_cairn_body("ce_new", _rfc3339(301)), sign_cairn(secret, _cairn_body("ce_new", _rfc3339(301)))),
        (no_created, sign_cairn(secret, no_created)),
        (no_id, sign_cairn(secret, no_id)),
        (body, {}),  # unsigned
    ]
    for case_body, headers in cases:
        resp = await _post(stack, webhook, case_body, headers)
        assert resp.status_code == 401, (case_body, headers)

    replayed = await _post(stack, webhook, body, {**sign_cairn(secret, body), "X-Cairn-Event-Id": "ce_ok"})
    assert replayed.status_code == 202 and replayed.json()["duplicate"] is True
    assert _counts(stack) == (1, 1)


# --- Forges (the table's remaining signed sources) ---------------------------------------------------------


@pytest.mark.parametrize("source", ["github", "gitea"])
async def test_forge_valid_invalid_and_replayed(stack: Stack, source: str) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, source)
    secret = webhook["secret"].encode()
    body = json.dumps(issue_payload()).encode()
    sign = sign_github if source == "github" else sign_gitea
    meta = {f"X-{source.capitalize() if source == 'gitea' else 'GitHub'}-Event": "issues"}
    delivery = {f"X-{'GitHub' if source == 'github' else 'Gitea'}-Delivery": str(uuid.uuid4())}
    ok = await _post(stack, webhook, body, {**sign(secret, body), **meta, **delivery})
    assert ok.status_code == 202 and ok.json()["created"] == 1
    bad = await _post(stack, webhook, body, {**sign(WRONG, body), **meta, **delivery})
    assert bad.status_code == 401
    again = await _post(stack, webhook, body, {**sign(secret, body), **meta, **delivery})
    assert again.json()["duplicate"] is True
    assert _counts(stack) == (1, 1)


# --- Reserved sources ---------------------------------------------------------------------------------------


async def test_reserved_schedule_source_is_refused_at_ingest_and_at_create(stack: Stack) -> None:
    agent = await stack.agent(source_types=["generic"])
    # Vending refuses a reserved source; even a ceiling that names it (written behind the API's back) cannot
    # make create_webhook mint one.
    stack.sql("UPDATE endpoints SET webhook_source_types = array_append(webhook_source_types, 'schedule')")
    refused = await agent.call("create_webhook", {"source_type": "schedule", "target_queue": "work"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden_source_type"

    token = uuid.uuid4().hex
    stack.sql(
        "INSERT INTO endpoint_webhooks (id, endpoint_id, source_type, target_queue, trust_mode, ingest_token)"
        " VALUES (%s, %s, 'schedule', 'work', 'internal', %s)",
        "wh_internal",
        agent.endpoint_id,
        token,
    )
    forged = await stack.http.post(f"/webhooks/w/{token}", json={"schedule_id": "sc_x"})
    assert forged.status_code == 404 and forged.json() == {"error": "unknown webhook"}
    listed = await agent.ok("list_webhooks", {})
    assert listed["webhooks"] == [] and listed["ceiling"]["used"] == 0
    assert _counts(stack) == (0, 0)
