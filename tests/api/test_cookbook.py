"""docs/cookbook.md's recipes, run as written: the JSON blocks of the page are what these tests install."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.conftest import Stack
from tests.helpers import issue_payload, post_github

COOKBOOK = Path(__file__).resolve().parents[2] / "docs" / "cookbook.md"


def block(name: str) -> dict[str, Any]:
    """The JSON block after ``<!-- cookbook: name -->``."""
    text = COOKBOOK.read_text()
    found = re.compile(r"```json\n(.*?)```", re.S).search(text, text.index(f"<!-- cookbook: {name} -->"))
    assert found is not None
    parsed: dict[str, Any] = json.loads(found.group(1))
    return parsed


def opened_by(login: str, number: int) -> dict[str, Any]:
    payload = issue_payload(number=number)
    payload["issue"]["user"] = payload["sender"] = {"login": login}
    return payload


def comment(thread_author: str, commenter: str, number: int) -> dict[str, Any]:
    return {
        "action": "created",
        "issue": {"number": number, "user": {"login": thread_author}},
        "comment": {"id": number * 10, "user": {"login": commenter}},
        "repository": {"full_name": "acme/app"},
        "sender": {"login": commenter},
    }


async def test_public_repository_recipe(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "triage"])
    hook = await agent.ok("create_webhook", block("public-repo-webhook"))
    saved = await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], **block("public-repo-rules")})
    assert saved["default_action"] == {"quarantine": True} and saved["on_fault"] == "hold"

    async def post(payload: dict[str, Any], delivery: str, event: str = "issues") -> dict[str, Any]:
        resp = await post_github(stack.http, hook, payload, delivery=delivery, event=event)
        assert resp.status_code == 202, resp.text
        out: dict[str, Any] = resp.json()
        return out

    async def todo(body: dict[str, Any]) -> dict[str, Any]:
        [ref] = body["todos"]
        found: dict[str, Any] = (await agent.ok("get_todo", {"todo_id": ref["id"]}))["todo"]
        return found

    # A maintainer (any case) opens an issue and comments on it: work, a work order from a trusted author.
    mine = await todo(await post(opened_by("Octo-Maintainer", 1), "m-1"))
    assert (mine["queue"], mine["work_order"]["author_trusted"]) == ("work", True)
    assert mine["routing"]["rule_id"] == "maintainer-issues"
    assert (await todo(await post(comment("octo-maintainer", "octo-bot", 1), "m-2", "issue_comment")))["queue"] == (
        "work"
    )

    # A stranger's issue, a stranger's comment on a maintainer's issue, a maintainer's on a stranger's: held.
    held = [
        await post(opened_by("stranger", 2), "s-1"),
        await post(comment("octo-maintainer", "stranger", 1), "s-2", "issue_comment"),
        await post(comment("stranger", "octo-maintainer", 2), "s-3", "issue_comment"),
    ]
    assert all(h["quarantined"] is True for h in held)
    listed = await agent.ok(
        "list_webhook_events",
        {"webhook_id": hook["webhook_id"], "disposition": "quarantined", "quarantine_state": "held"},
    )
    assert {e["id"] for e in listed["events"]} == {h["event_id"] for h in held}
    assert {e["quarantine"]["reason"] for e in listed["events"]} == {"untrusted_actor"}

    # A person releases the stranger's issue: triage, with who released it; a second release mints nothing.
    released = await agent.ok("release_webhook_event", {"event_id": held[0]["event_id"], "note": "real bug"})
    assert released["result"]["created"] == 1
    triaged = (await agent.ok("get_todo", {"todo_id": released["result"]["todos"][0]["id"]}))["todo"]
    assert triaged["queue"] == "triage" and triaged["routing"]["rule_id"] == "released"
    assert triaged["work_order"]["released_by"] == f"endpoint:{agent.endpoint_id}"
    assert triaged["work_order"]["author_trusted"] is False
    again = await agent.ok("release_webhook_event", {"event_id": held[0]["event_id"]})
    assert again["result"]["created"] == 0
    # The released comment goes to triage too (no issue subject, so no once-key); the last one is dismissed.
    comment_release = await agent.ok("release_webhook_event", {"event_id": held[1]["event_id"]})
    assert comment_release["result"]["disposition"] == "routed"
    dismissed = await agent.ok("dismiss_webhook_event", {"event_id": held[2]["event_id"], "note": "spam"})
    assert dismissed["state"] == "dismissed"
    left = await agent.ok("list_webhook_events", {"webhook_id": hook["webhook_id"], "quarantine_state": "held"})
    assert left["events"] == []
