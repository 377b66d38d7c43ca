"""rotate_webhook and delete_webhook: secrets retired at once, URLs torn down, the ceiling freed."""

from __future__ import annotations

import json

from tests.conftest import Stack
from tests.helpers import issue_payload, post_github, token_of


async def test_rotate_retires_the_old_secret_at_once_and_shows_the_new_one_once(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    assert (await post_github(stack.http, webhook, issue_payload(), delivery="d-0")).status_code == 202
    [(sealed_before,)] = stack.sql("SELECT secret_ciphertext FROM endpoint_webhooks")

    rotated = await agent.ok("rotate_webhook", {"webhook_id": webhook["webhook_id"]})
    assert set(rotated) == {"webhook_id", "ingest_url", "trust_mode", "secret"}
    assert rotated["webhook_id"] == webhook["webhook_id"] and rotated["trust_mode"] == "signed"
    assert rotated["ingest_url"] == webhook["ingest_url"]
    new_secret = rotated["secret"]
    assert new_secret.startswith("whsec_") and len(new_secret) == 70 and new_secret != webhook["secret"]

    old = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    assert old.status_code == 401
    assert stack.sql("SELECT count(*) FROM events WHERE external_id LIKE %s", "%:d-1")[0][0] == 0
    new = await post_github(stack.http, webhook, issue_payload(), delivery="d-1", secret=new_secret)
    assert new.status_code == 202 and new.json()["verified"] is True

    listed = await agent.ok("list_webhooks")
    assert new_secret not in json.dumps(listed) and webhook["secret"] not in json.dumps(listed)
    [(sealed_after,)] = stack.sql("SELECT secret_ciphertext FROM endpoint_webhooks")
    assert bytes(sealed_after) != bytes(sealed_before) and new_secret.encode() not in bytes(sealed_after)


async def test_rotate_with_a_new_ingest_token_404s_the_old_url(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rotated = await agent.ok("rotate_webhook", {"webhook_id": webhook["webhook_id"], "new_ingest_token": True})
    assert token_of(rotated["ingest_url"]) != token_of(webhook["ingest_url"])
    old_url = await post_github(stack.http, webhook, issue_payload(), delivery="d-1", secret=rotated["secret"])
    assert old_url.status_code == 404
    new_url = await post_github(stack.http, rotated, issue_payload(), delivery="d-1")
    assert new_url.status_code == 202
    [url] = [w["ingest_url"] for w in (await agent.ok("list_webhooks"))["webhooks"]]
    assert url == rotated["ingest_url"]


async def test_rotating_a_token_trust_webhook_always_replaces_its_url(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    rotated = await agent.ok("rotate_webhook", {"webhook_id": webhook["webhook_id"]})
    assert rotated["trust_mode"] == "token" and rotated["secret"] is None
    assert rotated["ingest_url"] != webhook["ingest_url"]
    old = await stack.http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", json={"hello": 1})
    new = await stack.http.post(f"/webhooks/w/{token_of(rotated['ingest_url'])}", json={"hello": 1})
    assert old.status_code == 404 and new.status_code == 202


async def test_rotate_and_delete_reach_only_the_callers_own_webhooks(stack: Stack) -> None:
    owner = await stack.agent()
    sibling = await stack.agent(owner.human_id)
    stranger = await stack.agent()
    webhook = await owner.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    [(sealed,)] = stack.sql("SELECT secret_ciphertext FROM endpoint_webhooks")
    for verb in ("rotate_webhook", "delete_webhook"):
        responses = [
            await sibling.call(verb, {"webhook_id": webhook["webhook_id"]}),
            await stranger.call(verb, {"webhook_id": webhook["webhook_id"]}),
            await owner.call(verb, {"webhook_id": "wh_000000000000000000000000"}),
            await owner.call(verb, {"webhook_id": "not an id"}),
        ]
        assert {r.status_code for r in responses} == {404}
        assert len({r.text for r in responses}) == 1
        assert responses[0].json()["error"]["code"] == "not_found"
    assert stack.sql("SELECT secret_ciphertext, state FROM endpoint_webhooks") == [(sealed, "live")]


async def test_trust_mode_is_never_accepted_by_rotate(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await agent.call("rotate_webhook", {"webhook_id": webhook["webhook_id"], "trust_mode": "token"})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"
    assert stack.sql("SELECT trust_mode FROM endpoint_webhooks") == [("signed",)]
    ok = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    assert ok.status_code == 202


async def test_delete_tears_the_webhook_down_and_frees_its_ceiling_slot(stack: Stack) -> None:
    human = await stack.human()
    agent = await stack.agent(human, webhook_max=1)
    other = await stack.agent(human)
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("add_webhook_route", {"webhook_id": webhook["webhook_id"], "target_endpoint_id": other.endpoint_id})
    full = await agent.call("create_webhook", {"source_type": "github", "target_queue": "work"})
    assert full.status_code == 403 and full.json()["error"]["code"] == "ceiling_exceeded"

    assert await agent.ok("delete_webhook", {"webhook_id": webhook["webhook_id"]}) == {
        "webhook_id": webhook["webhook_id"],
        "deleted": True,
    }
    gone = await post_github(stack.http, webhook, issue_payload(), delivery="d-1")
    assert gone.status_code == 404
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert stack.sql("SELECT count(*) FROM webhook_routes")[0][0] == 0
    assert stack.sql("SELECT state, secret_ciphertext IS NULL FROM endpoint_webhooks") == [("deleted", True)]
    listed = await agent.ok("list_webhooks")
    assert listed["webhooks"] == [] and listed["ceiling"]["used"] == 0

    # A second delete names a webhook that no longer exists: not_found, as for any unknown id.
    again = await agent.call("delete_webhook", {"webhook_id": webhook["webhook_id"]})
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
    rotate = await agent.call("rotate_webhook", {"webhook_id": webhook["webhook_id"]})
    assert rotate.status_code == 404

    await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})


async def test_rotate_and_delete_use_the_webhook_admin_rate_class(stack: Stack) -> None:
    from api.verbs import REGISTRY

    for name in ("create_webhook", "rotate_webhook", "delete_webhook"):
        assert REGISTRY[name].rate_class == "webhook_admin"
        assert REGISTRY[name].family == "webhooks"
    for name in ("list_webhook_events", "get_webhook_event"):
        assert REGISTRY[name].family == "events"
