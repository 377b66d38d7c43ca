"""create_webhook / list_webhooks within the vended ceiling; secrets are shown once."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import Stack


async def test_ceiling_checks_in_the_spec_order(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"], webhook_max=1, source_types=["github", "generic"])
    # Source type is checked first, even when the queue is also wrong.
    resp = await agent.call("create_webhook", {"source_type": "stripe", "target_queue": "elsewhere"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden_source_type"
    resp = await agent.call("create_webhook", {"source_type": "github", "target_queue": "elsewhere"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    resp = await agent.call("create_webhook", {"source_type": "generic", "target_queue": "work"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "ceiling_exceeded"
    assert stack.sql("SELECT count(*) FROM endpoint_webhooks")[0][0] == 1
    resp = await agent.call("create_webhook", {"source_type": "ftp", "target_queue": "work"})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"


async def test_concurrent_creates_never_pass_the_ceiling(stack: Stack) -> None:
    agent = await stack.agent(webhook_max=3)
    results = await asyncio.gather(
        *(agent.call("create_webhook", {"source_type": "generic", "target_queue": "work"}) for _ in range(10))
    )
    assert sorted(r.status_code for r in results) == [200] * 3 + [403] * 7
    assert stack.sql("SELECT count(*) FROM endpoint_webhooks")[0][0] == 3


async def test_secret_is_revealed_once_and_held_encrypted(stack: Stack) -> None:
    agent = await stack.agent()
    made = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    secret = made["secret"]
    assert secret.startswith("whsec_") and len(secret) == 6 + 64
    assert made["ingest_url"].startswith("http://testserver/webhooks/w/")
    listed = await agent.ok("list_webhooks")
    assert secret not in json.dumps(listed)
    assert "secret" not in listed["webhooks"][0]
    assert listed["ceiling"] == {
        "max": 5,
        "allowed_source_types": ["github", "gitea", "generic", "stripe", "slack", "cairn"],
        "allowed_queues": ["work"],
        "used": 1,
    }
    [(sealed,)] = stack.sql("SELECT secret_ciphertext FROM endpoint_webhooks")
    assert secret.encode() not in bytes(sealed)


async def test_trust_mode_cannot_be_supplied(stack: Stack) -> None:
    agent = await stack.agent()
    resp = await agent.call("create_webhook", {"source_type": "github", "target_queue": "work", "trust_mode": "token"})
    assert resp.status_code == 422
    assert stack.sql("SELECT count(*) FROM endpoint_webhooks")[0][0] == 0


async def test_list_webhooks_shows_only_own(stack: Stack) -> None:
    a = await stack.agent()
    b = await stack.agent()
    await a.ok("create_webhook", {"source_type": "generic", "target_queue": "work"})
    assert (await b.ok("list_webhooks"))["webhooks"] == []
