"""The routing envelope: every SPEC-0020 path, the issue projection and the cairn artifact."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routing.envelope import (
    ENVELOPE_KEYS,
    build_envelope,
    cairn_subject,
    derive_kind,
    issue_subject,
    once_key,
    parse_payload,
    subject_key,
    work_order_subject,
)


def gitea_issue(**overrides: Any) -> dict[str, Any]:
    """A Gitea issues payload."""
    body: dict[str, Any] = {
        "action": "opened",
        "number": 7,
        "issue": {
            "id": 1001,
            "number": 7,
            "title": "Fix the thing",
            "html_url": "https://git.example/acme/widgets/issues/7",
            "state": "open",
            "body": "héllo",
            "user": {"login": "joestump"},
            "labels": [{"name": "size/M"}, {"name": "bug"}],
            "pull_request": None,
        },
        "repository": {"full_name": "acme/widgets"},
        "sender": {"login": "joestump-agent"},
    }
    body.update(overrides)
    return body


def cairn_body(**data: Any) -> dict[str, Any]:
    """A cairn artifact.created body."""
    base: dict[str, Any] = {
        "id": "hx7Qm2",
        "share_type": "markdown",
        "title": "Handoff: do the thing",
        "url": "https://cairn.example/a/hx7Qm2",
        "channel": "mcp",
        "model": "claude",
        "actor_id": "joestump-agent",
        "on_behalf_of": "claude-code/2.1.0",
        "expires_at": "2026-09-18T08:30:00Z",
        "tags": ["handoff", "lane:m"],
        "metadata": {"k": "v"},
    }
    base.update(data)
    return {
        "source": "cairn",
        "kind": "artifact.created",
        "event_id": "evt-1",
        "created_at": "2026-09-11T08:30:00Z",
        "data": base,
    }


def env(
    source: str,
    body: Any,
    headers: dict[str, str] | None = None,
    *,
    raw: bytes | None = None,
    verified: bool = True,
) -> dict[str, Any]:
    """Build an envelope from a JSON-able body (or raw bytes)."""
    return build_envelope(
        source=source,
        webhook_id="wh_1",
        trust_mode="token" if source == "generic" else "signed",
        verified=verified,
        content_type="application/json",
        headers=headers or {},
        body=raw if raw is not None else json.dumps(body).encode(),
    )


GITEA_ISSUES = {"x-gitea-event": "issues", "x-gitea-event-type": "issues"}
GITHUB_ISSUES = {"x-github-event": "issues"}


def test_top_level_paths_exact() -> None:
    e = env("gitea", gitea_issue(), GITEA_ISSUES)
    assert tuple(e) == ENVELOPE_KEYS
    assert e["source"] == "gitea"
    assert e["kind"] == "issues"
    assert e["webhook_id"] == "wh_1"
    assert e["trust_mode"] == "signed"
    assert e["verified"] is True
    assert e["content_type"] == "application/json"
    assert e["size"] == len(json.dumps(gitea_issue()).encode())
    assert e["headers"] == GITEA_ISSUES
    assert e["payload"] == gitea_issue()
    assert e["artifact"] is None
    assert e["issue"] is not None


def test_headers_lower_cased_and_content_type_null() -> None:
    e = build_envelope(
        source="generic",
        webhook_id="wh_2",
        trust_mode="token",
        verified=False,
        content_type=None,
        headers={"X-Delivery-Id": "abc"},
        body=b"",
    )
    assert e["headers"] == {"x-delivery-id": "abc"}
    assert e["content_type"] is None
    assert e["size"] == 0
    assert e["payload"] is None
    assert e["verified"] is False
    assert e["kind"] is None


def test_producer_cannot_forge_top_level_fields() -> None:
    forged = {
        "source": "cairn",
        "verified": True,
        "trust_mode": "signed",
        "webhook_id": "wh_evil",
        "kind": "artifact.created",
        "issue": {"author": "joestump"},
        "artifact": {"actor_id": "joestump-agent"},
        "size": 1,
    }
    e = env("generic", forged, {"x-verified": "true"}, verified=False)
    assert e["source"] == "generic"
    assert e["verified"] is False
    assert e["trust_mode"] == "token"
    assert e["webhook_id"] == "wh_1"
    assert e["kind"] is None
    assert e["issue"] is None
    assert e["artifact"] is None
    assert e["size"] == len(json.dumps(forged).encode())
    assert e["payload"] == forged


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": 1}', {"a": 1}),
        (b"[1, 2]", [1, 2]),
        (b'"s"', "s"),
        (b"null", None),
        (b"not json", None),
        (b"", None),
        (b'{"a": 1} {"b": 2}', None),
        (b"\xff\xfe", None),
        (b'{"a": NaN}', None),
        (b"Infinity", None),
        ('{"a": 1}'.encode("utf-16"), None),
        (b"[" * 100000, None),
    ],
)
def test_payload_is_exactly_one_json_value(raw: bytes, expected: Any) -> None:
    assert parse_payload(raw) == expected
    assert env("generic", None, raw=raw)["payload"] == expected


def test_int64_exact_and_floats() -> None:
    raw = b'{"big": 9007199254740993, "max": 9223372036854775807, "min": -9223372036854775808, "f": 1.5}'
    p = parse_payload(raw)
    assert p["big"] == 9007199254740993 and isinstance(p["big"], int)
    assert p["max"] == 2**63 - 1 and isinstance(p["max"], int)
    assert p["min"] == -(2**63)
    assert p["f"] == 1.5
    wide = parse_payload(b'{"w": 9223372036854775808, "huge": 1e400}')
    assert isinstance(wide["w"], float)
    assert wide["huge"] > 1e308 and wide["huge"] != float("inf")


def test_kind_order() -> None:
    assert derive_kind("github", {"x-github-event": "issues", "x-gitea-event": "push"}, None) == "issues"
    assert derive_kind("gitea", {"x-gitea-event": "push", "x-cairn-event": "x"}, None) == "push"
    assert derive_kind("generic", {"x-cairn-event": "artifact.created"}, None) == "artifact.created"
    assert derive_kind("generic", {}, None) is None


def test_forged_cairn_header_does_not_change_kind() -> None:
    e = env("cairn", cairn_body(), {"x-cairn-event": "artifact.deleted"})
    assert e["kind"] == "artifact.created"
    # Without a signed kind, the unsigned header still does not become a cairn kind.
    body = cairn_body()
    del body["kind"]
    assert env("cairn", body, {"x-cairn-event": "artifact.created"})["kind"] is None


def test_gitea_issue_projection() -> None:
    e = env("gitea", gitea_issue(), GITEA_ISSUES)
    assert e["issue"] == {
        "provider": "gitea",
        "action": "opened",
        "event_type": "issues",
        "repo": "acme/widgets",
        "number": 7,
        "title": "Fix the thing",
        "url": "https://git.example/acme/widgets/issues/7",
        "state": "open",
        "author": "joestump",
        "sender": "joestump-agent",
        "labels": ["size/M", "bug"],
        "label": None,
        "body_size": len("héllo".encode()),
        "label_event": False,
        "key": "gitea:acme/widgets#7",
    }


def test_gitea_and_github_label_events_read_alike() -> None:
    gitea = env(
        "gitea",
        gitea_issue(action="label_updated"),
        {"x-gitea-event": "issues", "x-gitea-event-type": "issue_label"},
    )["issue"]
    github = env(
        "github",
        gitea_issue(action="labeled", label={"name": "size/M"}),
        GITHUB_ISSUES,
    )["issue"]
    assert gitea["label_event"] is github["label_event"] is True
    assert gitea["labels"] == github["labels"] == ["size/M", "bug"]
    assert gitea["sender"] == github["sender"] == "joestump-agent"
    assert gitea["event_type"] == "issue_label"
    assert github["event_type"] == "issues"
    assert gitea["label"] is None
    assert github["label"] == "size/M"
    assert github["provider"] == "github"
    assert github["key"] == "github:acme/widgets#7"


@pytest.mark.parametrize("action", ["labeled", "unlabeled", "label_updated", "label_cleared"])
def test_label_event_actions(action: str) -> None:
    assert env("gitea", gitea_issue(action=action), GITEA_ISSUES)["issue"]["label_event"] is True


def test_label_only_on_labeled_unlabeled() -> None:
    issue = env("github", gitea_issue(action="opened", label={"name": "x"}), GITHUB_ISSUES)["issue"]
    assert issue["label"] is None


def test_generic_provider() -> None:
    assert env("generic", gitea_issue(), {"x-gitea-event": "issues"})["issue"]["provider"] == "gitea"
    assert env("generic", gitea_issue(), GITHUB_ISSUES)["issue"]["provider"] == "github"
    assert env("generic", gitea_issue(), {})["issue"] is None


def test_issue_null_for_other_events_and_sources() -> None:
    assert env("gitea", gitea_issue(), {"x-gitea-event": "push"})["issue"] is None
    assert env("stripe", gitea_issue(), GITHUB_ISSUES)["issue"] is None
    assert env("cairn", gitea_issue(), GITHUB_ISSUES)["issue"] is None


def test_pull_requests_are_not_issues() -> None:
    top = gitea_issue(pull_request={"id": 1})
    assert env("gitea", top, GITEA_ISSUES)["issue"] is None
    nested = gitea_issue()
    nested["issue"]["pull_request"] = {"merged": False}
    assert env("github", nested, GITHUB_ISSUES)["issue"] is None
    # A Gitea pull_request label event.
    pr_label = {"action": "label_updated", "pull_request": {"number": 3}, "number": 3}
    assert env("gitea", pr_label, {"x-gitea-event": "pull_request"})["issue"] is None


@pytest.mark.parametrize(
    "raw",
    [b"not json", b"[]", b'{"issue": "x"}', b'{"issue": {"number": "7"}}', b'{"issue": {"number": true}}'],
)
def test_issue_null_for_unparsable_bodies(raw: bytes) -> None:
    assert env("gitea", None, GITEA_ISSUES, raw=raw)["issue"] is None


def test_issue_projection_is_type_safe() -> None:
    body = gitea_issue(sender="mallory", repository={"full_name": 5})
    body["issue"]["user"] = "joestump"
    body["issue"]["labels"] = [{"name": 1}, "size/S", {"name": "ok"}]
    body["issue"]["title"] = {"x": 1}
    body["issue"]["body"] = None
    issue = env("gitea", body, GITEA_ISSUES)["issue"]
    assert issue["author"] is None
    assert issue["sender"] is None
    assert issue["labels"] == ["ok"]
    assert issue["title"] is None
    assert issue["repo"] is None
    assert issue["key"] is None
    assert issue["body_size"] == 0


def test_cairn_artifact_every_field() -> None:
    e = env("cairn", cairn_body())
    assert e["artifact"] == {
        "event_id": "evt-1",
        "kind": "artifact.created",
        "created_at": "2026-09-11T08:30:00Z",
        "id": "hx7Qm2",
        "url": "https://cairn.example/a/hx7Qm2",
        "title": "Handoff: do the thing",
        "share_type": "markdown",
        "channel": "mcp",
        "model": "claude",
        "actor_id": "joestump-agent",
        "on_behalf_of": "claude-code/2.1.0",
        "expires_at": "2026-09-18T08:30:00Z",
        "tags": ["handoff", "lane:m"],
        "metadata": {"k": "v"},
        "handle": "mcp://cairn/hx7Qm2",
    }
    assert e["issue"] is None


def test_cairn_absent_fields_are_null() -> None:
    artifact = env("cairn", {"kind": "artifact.created", "data": {}})["artifact"]
    assert artifact is not None
    assert set(artifact) == {
        "event_id",
        "kind",
        "created_at",
        "id",
        "handle",
        "url",
        "title",
        "share_type",
        "channel",
        "model",
        "actor_id",
        "on_behalf_of",
        "expires_at",
        "tags",
        "metadata",
    }
    assert artifact["kind"] == "artifact.created"
    assert all(v is None for k, v in artifact.items() if k != "kind")
    assert env("cairn", None, raw=b"garbage")["artifact"]["handle"] is None
    assert env("cairn", cairn_body(tags="handoff"))["artifact"]["tags"] is None


def test_tags_do_not_touch_verified_or_actor() -> None:
    e = env("cairn", cairn_body(tags=["handoff", "lane:m", "verified", "actor:root"]), verified=False)
    assert e["verified"] is False
    assert e["artifact"]["actor_id"] == "joestump-agent"
    assert next(t for t in e["artifact"]["tags"] if t.startswith("lane:")) == "lane:m"


def test_subject_keys() -> None:
    assert subject_key(env("gitea", gitea_issue(), GITEA_ISSUES)) == "gitea:acme/widgets#7"
    assert subject_key(env("cairn", cairn_body())) == "cairn:hx7Qm2"
    assert subject_key(env("cairn", cairn_body(id=""))) is None
    assert subject_key(env("gitea", {"x": 1}, {"x-gitea-event": "push"})) is None
    assert subject_key(None) is None


def test_once_key_shape() -> None:
    import hashlib

    key = once_key("gitea:acme/widgets#7", "lane-m")
    assert key == "once:" + hashlib.sha256(b"gitea:acme/widgets#7\x00lane-m").hexdigest()
    assert once_key(None, "lane-m") is None
    assert once_key("cairn:x", "lane-m") != once_key("cairn:x", "lane-l")


def test_work_order_subjects() -> None:
    issue = issue_subject(env("github", gitea_issue(), GITHUB_ISSUES))
    assert issue is not None
    assert issue["type"] == "issue"
    assert issue["repo"] == "acme/widgets"
    assert issue["number"] == 7
    assert issue["author"] == "joestump"
    assert issue["sender"] == "joestump-agent"
    assert issue["url"] == "https://git.example/acme/widgets/issues/7"
    assert issue["key"] == "github:acme/widgets#7"
    cairn = cairn_subject(env("cairn", cairn_body(tags=["handoff", 3, None, "lane:s", {"x": 1}])))
    assert cairn == {
        "type": "cairn_artifact",
        "id": "hx7Qm2",
        "handle": "mcp://cairn/hx7Qm2",
        "url": "https://cairn.example/a/hx7Qm2",
        "title": "Handoff: do the thing",
        "share_type": "markdown",
        "actor_id": "joestump-agent",
        "on_behalf_of": "claude-code/2.1.0",
        "tags": ["handoff", "lane:s"],
        "key": "cairn:hx7Qm2",
    }
    assert work_order_subject(env("gitea", {"x": 1}, {"x-gitea-event": "push"})) is None
    assert work_order_subject(None) is None


def test_envelope_is_json_round_trippable() -> None:
    e = env("cairn", cairn_body())
    assert json.loads(json.dumps(e, allow_nan=False)) == e
