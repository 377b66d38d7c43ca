"""The spine, end to end: signed delivery → RouteDelivery → event + todo → claim → complete."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import Stack
from tests.helpers import issue_payload, post_gitea, post_github, token_of


async def test_signed_github_delivery_becomes_a_claimable_todo(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    assert webhook["trust_mode"] == "signed" and webhook["secret"].startswith("whsec_")

    resp = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["created"] == 1 and body["verified"] is True and body["trust_mode"] == "signed"
    [todo] = body["todos"]
    assert todo["endpoint_id"] == agent.endpoint_id and todo["queue"] == "work" and todo["created"] is True
    assert "routing" not in body and "trace" not in json.dumps(body)

    claimed = await agent.ok("claim_next", {})
    assert claimed["todo"]["id"] == todo["id"]
    assert claimed["todo"]["state"] == "claimed" and claimed["todo"]["owner"] == f"agent:{agent.agent_id}"
    assert claimed["todo"]["routing"] == {
        "stage": "default",
        "cause": "no_match_default",
        "action": {"queue": "work"},
    }
    assert claimed["todo"]["kind"] == "issues"
    assert "acme/app#7" in claimed["todo"]["title"]
    done = await agent.ok("complete", {"todo_id": todo["id"], "result": {"ok": True}})
    assert done["todo"]["state"] == "done"

    [(trace, disposition, verified, external_id, headers)] = stack.sql(
        "SELECT routing_trace, disposition, verified, external_id, headers FROM events WHERE id = %s",
        body["event_id"],
    )
    assert trace == {"stage": "default", "cause": "no_match_default", "action": {"queue": "work"}}
    assert disposition == "routed" and verified is True
    assert external_id == f"{webhook['webhook_id']}:d-1"
    assert headers["x-hub-signature-256"] == "«redacted»"

    again = await agent.ok("claim_next", {})
    assert again == {"empty": True, "todo": None}


async def test_twenty_concurrent_redeliveries_make_one_event_and_one_todo(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    payload = issue_payload(number=9)
    responses = await asyncio.gather(*(post_github(stack.http, webhook, payload, delivery="same") for _ in range(20)))
    assert all(r.status_code == 202 for r in responses), [r.text for r in responses]
    event_ids = {r.json()["event_id"] for r in responses}
    todo_ids = {t["id"] for r in responses for t in r.json()["todos"]}
    assert len(event_ids) == 1 and len(todo_ids) == 1
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 1

    later = await post_github(stack.http, webhook, payload, delivery="same")
    assert later.status_code == 202
    assert later.json()["duplicate"] is True and later.json()["created"] == 0
    assert later.json()["todos"] == [
        {"id": todo_ids.pop(), "endpoint_id": agent.endpoint_id, "queue": "work", "created": False}
    ]


async def test_bad_signatures_unknown_tokens_and_oversized_bodies_write_nothing(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wrong = await post_github(stack.http, webhook, issue_payload(), secret="whsec_" + "0" * 64)
    assert wrong.status_code == 401 and wrong.json() == {"error": "signature verification failed"}
    missing = await stack.http.post(
        f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=b"{}", headers={"X-GitHub-Event": "issues"}
    )
    assert missing.status_code == 401
    unknown = await stack.http.post("/webhooks/w/" + "0" * 32, content=b"{}")
    assert unknown.status_code == 404
    malformed = await stack.http.post("/webhooks/w/not-a-token", content=b"{}")
    assert malformed.status_code == 404
    big = await post_github(stack.http, webhook, b"x" * (1024 * 1024 + 1))
    assert big.status_code == 413
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 0


async def test_gitea_and_generic_deliveries(stack: Stack) -> None:
    agent = await stack.agent()
    gitea = await agent.ok("create_webhook", {"source_type": "gitea", "target_queue": "work"})
    resp = await post_gitea(stack.http, gitea, issue_payload(), delivery="g-1")
    assert resp.status_code == 202 and resp.json()["created"] == 1 and resp.json()["verified"] is True
    [(kind, ext)] = stack.sql("SELECT kind, external_id FROM events WHERE id = %s", resp.json()["event_id"])
    assert kind == "issues" and ext == f"{gitea['webhook_id']}:g-1"

    generic = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    assert generic["trust_mode"] == "token" and generic["secret"] is None
    url = f"/webhooks/w/{token_of(generic['ingest_url'])}"
    first = await stack.http.post(url, json={"hello": "world"}, headers={"X-Delivery-Id": "x-1"})
    assert first.status_code == 202 and first.json()["created"] == 1 and first.json()["verified"] is False
    assert first.json()["trust_mode"] == "token"
    dup = await stack.http.post(url, json={"hello": "world"}, headers={"X-Delivery-Id": "x-1"})
    assert dup.json()["duplicate"] is True
    [(ext,)] = stack.sql("SELECT external_id FROM events WHERE id = %s", first.json()["event_id"])
    assert ext == f"{generic['webhook_id']}:x-1"


async def test_route_to_second_endpoint_of_same_human_mints_one_todo_per_target(stack: Stack) -> None:
    human = await stack.human()
    owner = await stack.agent(human)
    second = await stack.agent(human)
    webhook = await owner.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    stack.sql(
        "INSERT INTO webhook_routes (webhook_id, target_endpoint_id) VALUES (%s, %s)",
        webhook["webhook_id"],
        second.endpoint_id,
    )
    resp = await post_github(stack.http, webhook, issue_payload())
    todos = resp.json()["todos"]
    assert [t["endpoint_id"] for t in todos] == [owner.endpoint_id, second.endpoint_id]
    assert (await owner.ok("claim_next", {}))["todo"]["id"] == todos[0]["id"]
    assert (await second.ok("claim_next", {}))["todo"]["id"] == todos[1]["id"]


async def test_a_revoked_owner_leaves_no_target_and_the_producer_retries(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
    resp = await post_github(stack.http, webhook, issue_payload())
    assert resp.status_code == 503 and resp.json() == {"error": "webhook has no live delivery target"}
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0


async def test_payload_with_a_nul_character_is_kept_raw_on_the_event(stack: Stack) -> None:
    agent = await stack.agent()
    generic = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    url = f"/webhooks/w/{token_of(generic['ingest_url'])}"
    body = b'{"text": "a\\u0000b", "escaped": "not a nul: \\\\u0000"}'
    resp = await stack.http.post(
        url, content=body, headers={"Content-Type": "application/json", "X-Delivery-Id": "nul"}
    )
    assert resp.status_code == 202 and resp.json()["created"] == 1
    [(payload,)] = stack.sql("SELECT payload FROM todos")
    assert payload is None  # jsonb cannot hold NUL
    [(raw,)] = stack.sql("SELECT payload FROM events")
    assert bytes(raw) == body
    clean = await stack.http.post(
        url, content=b'{"escaped": "\\\\u0000"}', headers={"Content-Type": "application/json", "X-Delivery-Id": "esc"}
    )
    todo_id = clean.json()["todos"][0]["id"]
    [(kept,)] = stack.sql("SELECT payload FROM todos WHERE id = %s", todo_id)
    assert kept == {"escaped": "\\u0000"}
