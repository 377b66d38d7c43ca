"""The trust gate, pure: parsing trusted_actors, the .actor projection for every source, the gate's decision,
quarantine actions, and the reserved queue name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from routing.decision import decide
from routing.envelope import build_envelope
from routing.models import Evaluation, Grant, Target
from routing.router import route
from routing.rules import RuleValidationError, parse_action, validate_default_action
from routing.trust import (
    NOBODY,
    GateError,
    actor_projection,
    gate_decision,
    parse_gate,
    quarantine_reason,
    read_gate,
)
from routing.workorder import build_work_order
from tests.helpers import compiled_here

MAINTAINERS = {"logins": ["Maintainer", "bot-two"], "match": "both"}


def comment_on(issue_author: str, commenter: str, sender: str | None = None) -> dict[str, Any]:
    """A GitHub issue_comment body: who wrote the thread, who commented, who sent it (the commenter by default)."""
    return {
        "action": "created",
        "issue": {"number": 3, "user": {"login": issue_author}},
        "comment": {"id": 9, "user": {"login": commenter}},
        "repository": {"full_name": "acme/app"},
        "sender": {"login": sender or commenter},
    }


def actor(body: Any, gate: Any, source: str = "github") -> dict[str, Any]:
    return actor_projection(source, body, gate)


def gated(match: str) -> dict[str, Any]:
    return {"logins": ["maintainer"], "match": match}


# --- parse_gate: one parser for the save and the run ---------------------------------------------------------


def test_the_three_shapes_normalized() -> None:
    assert parse_gate({"allow_all": True}, "github")[0] == {"allow_all": True}
    assert parse_gate({"logins": ["a", "b", "a"]}, "gitea")[0] == {"logins": ["a", "b"], "match": "both"}
    assert parse_gate({"logins": [], "match": "sender"}, "github")[0] == {"logins": [], "match": "sender"}
    assert parse_gate({"actor_ids": ["joe@example.com"]}, "cairn")[0] == {"actor_ids": ["joe@example.com"]}


@pytest.mark.parametrize(
    ("value", "source", "says"),
    [
        ({"allow_all": True}, "stripe", "applies to github, gitea, cairn webhooks, not stripe"),
        ({"logins": ["a"]}, "generic", "not generic"),
        ("everyone", "github", "must be an object"),
        ({}, "github", "must be one of"),
        ({"allow_all": False}, "github", "allow_all stands alone"),
        ({"allow_all": True, "logins": []}, "github", "allow_all stands alone"),
        ({"logins": "alice"}, "github", "logins must be a list"),
        ({"logins": ["alice", 7]}, "github", "non-empty strings"),
        ({"logins": [""]}, "github", "non-empty strings"),
        ({"logins": ["a"], "match": "anyone"}, "github", "match must be one of sender, author, both"),
        ({"logins": ["a"], "extra": 1}, "github", "unknown field(s) beside logins: extra"),
        ({"logins": ["a"]}, "cairn", "a cairn webhook trusts actor_ids"),
        ({"actor_ids": ["a"]}, "github", "a github webhook trusts logins"),
        ({"actor_ids": ["a"], "match": "sender"}, "cairn", "unknown field(s) beside actor_ids: match"),
        ({"logins": ["x" * 257]}, "github", "longer than 256"),
        ({"logins": [f"u{i}" for i in range(1001)]}, "github", "the limit is 1000"),
    ],
)
def test_what_is_not_a_gate(value: Any, source: str, says: str) -> None:
    with pytest.raises(GateError, match=None) as info:
        parse_gate(value, source)
    assert says in str(info.value)


def test_a_stored_value_that_cannot_be_read_trusts_no_one() -> None:
    assert read_gate(None, "github") is None
    for stored in ({"logins": "maintainer"}, {"bogus": 1}, {"actor_ids": ["x"]}, {"allow_all": "yes"}):
        assert read_gate(stored, "github") is NOBODY
        projected = actor(comment_on("maintainer", "maintainer"), stored)
        assert (projected["sender_trusted"], projected["author_trusted"], projected["trusted"]) == (False, False, False)
    # A gate stored on a source that has no actor at all (written past the verbs) holds everything too.
    assert actor_projection("stripe", {"id": "evt_1"}, {"allow_all": True})["trusted"] is False


# --- .actor for every source ----------------------------------------------------------------------------------


def test_forge_actor_without_a_gate_has_null_flags() -> None:
    assert actor(comment_on("maintainer", "stranger"), None) == {
        "sender": "stranger",
        "author": "stranger",
        "sender_trusted": None,
        "author_trusted": None,
        "trusted": None,
    }


def test_author_is_the_first_of_comment_review_pull_request_issue_discussion() -> None:
    pr_review = {
        "review": {"user": {"login": "reviewer"}},
        "pull_request": {"user": {"login": "pr-author"}},
        "sender": {"login": "reviewer"},
    }
    assert actor(pr_review, None)["author"] == "reviewer"
    assert actor({"pull_request": {"user": {"login": "pr-author"}}, "sender": {"login": "s"}}, None)["author"] == (
        "pr-author"
    )
    assert actor({"discussion": {"user": {"login": "d"}}, "sender": {"login": "s"}}, None)["author"] == "d"
    # Empty logins are skipped; a push (no comment, review or thread) has no author.
    empty_comment = comment_on("thread-author", "")
    assert actor(empty_comment, None)["author"] == "thread-author"
    assert actor({"ref": "refs/heads/main", "sender": {"login": "pusher"}}, None)["author"] is None


def test_gitea_review_without_a_user_is_the_senders() -> None:
    body = {
        "action": "reviewed",
        "review": {"type": "pull_request_review_approved", "content": "lgtm"},
        "pull_request": {"user": {"login": "maintainer"}},
        "sender": {"login": "stranger"},
    }
    assert actor(body, gated("author"), "gitea")["author"] == "stranger"
    assert actor(body, gated("author"), "gitea")["author_trusted"] is False
    # GitHub always names the reviewer: a review object without one is no one's, so it trusts no one.
    github = actor(body, gated("author"), "github")
    assert (github["author"], github["author_trusted"]) == ("maintainer", False)


def test_a_present_value_of_the_wrong_type_empties_the_projection() -> None:
    for body in (
        {**comment_on("maintainer", "maintainer"), "sender": "maintainer"},
        {**comment_on("maintainer", "maintainer"), "comment": {"user": {"login": 7}}},
        {**comment_on("maintainer", "maintainer"), "issue": {"user": ["maintainer"]}},
        {**comment_on("maintainer", "maintainer"), "discussion": "x"},
    ):
        assert actor(body, gated("both")) == {
            "sender": None,
            "author": None,
            "sender_trusted": False,
            "author_trusted": False,
            "trusted": False,
        }


def test_keys_match_exactly_and_duplicates_are_last_wins_like_payload() -> None:
    raw = b'{"sender": {"login": "stranger"}, "sender": {"login": "maintainer"}, "Comment": {"user": {"login": "x"}}}'
    env = build_envelope(
        source="github",
        webhook_id="wh_1",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={"x-github-event": "push"},
        body=raw,
        trusted_actors=gated("both"),
    )
    assert env["payload"]["sender"] == {"login": "maintainer"}
    assert env["actor"]["sender"] == "maintainer"
    assert env["actor"]["author"] is None  # "Comment" is not "comment"
    assert env["actor"]["trusted"] is True  # a push is its sender's own doing


def test_cairn_actor_is_the_signed_actor_id_never_on_behalf_of() -> None:
    body = {"kind": "artifact.created", "data": {"id": "a1", "actor_id": "mallory", "on_behalf_of": "joestump-agent"}}
    gate = {"actor_ids": ["joestump-agent"]}
    projected = actor(body, gate, "cairn")
    assert projected == {
        "sender": "mallory",
        "author": "mallory",
        "sender_trusted": False,
        "author_trusted": False,
        "trusted": False,
    }
    trusted = actor({"data": {"actor_id": "joestump-agent", "on_behalf_of": "anything"}}, gate, "cairn")
    assert trusted["trusted"] is True
    # Actor ids compare exactly: no case folding.
    assert actor({"data": {"actor_id": "JoeStump-Agent"}}, gate, "cairn")["trusted"] is False
    assert actor({"data": {"actor_id": 42}}, gate, "cairn")["sender"] is None


@pytest.mark.parametrize("source", ["stripe", "slack", "generic"])
def test_other_sources_have_an_all_null_actor(source: str) -> None:
    assert actor(comment_on("maintainer", "maintainer"), None, source) == {
        "sender": None,
        "author": None,
        "sender_trusted": None,
        "author_trusted": None,
        "trusted": None,
    }


def test_actor_sits_on_top_of_every_envelope() -> None:
    for source in ("github", "gitea", "cairn", "stripe", "slack", "generic"):
        env = build_envelope(
            source=source,
            webhook_id="wh_1",
            trust_mode="signed",
            verified=True,
            content_type=None,
            headers={},
            body=b"{}",
        )
        assert set(env["actor"]) == {"sender", "author", "sender_trusted", "author_trusted", "trusted"}
        assert env["release"] is None


# --- match: sender, author, both -----------------------------------------------------------------------------


def test_a_strangers_comment_on_a_maintainers_issue() -> None:
    body = comment_on("maintainer", "stranger")
    flags = {m: actor(body, gated(m))["trusted"] for m in ("sender", "author", "both")}
    assert flags == {"sender": False, "author": False, "both": False}


def test_a_maintainers_comment_on_a_strangers_issue() -> None:
    # The comment is the maintainer's, the thread a stranger's: author trust needs both.
    body = comment_on("stranger", "maintainer")
    flags = {m: actor(body, gated(m))["trusted"] for m in ("sender", "author", "both")}
    assert flags == {"sender": True, "author": False, "both": False}


def test_a_maintainer_labels_a_strangers_issue() -> None:
    body = {"action": "labeled", "issue": {"user": {"login": "stranger"}}, "sender": {"login": "maintainer"}}
    flags = {m: actor(body, gated(m))["trusted"] for m in ("sender", "author", "both")}
    assert flags == {"sender": True, "author": False, "both": False}


def test_a_strangers_event_on_a_maintainers_issue_sent_by_the_maintainer() -> None:
    body = comment_on("maintainer", "maintainer", sender="stranger")
    flags = {m: actor(body, gated(m))["trusted"] for m in ("sender", "author", "both")}
    assert flags == {"sender": False, "author": True, "both": False}


def test_logins_compare_ascii_case_insensitively() -> None:
    assert actor(comment_on("MAINTAINER", "mAiNtAiNeR"), MAINTAINERS)["trusted"] is True
    assert actor(comment_on("Bot-Two", "BOT-TWO"), MAINTAINERS)["trusted"] is True
    # Only A-Z fold: a non-ASCII letter is compared as written.
    unicode_gate = {"logins": ["élan"], "match": "sender"}
    assert actor(comment_on("x", "ÉLAN"), unicode_gate)["trusted"] is False
    assert actor(comment_on("x", "éLAN"), unicode_gate)["trusted"] is True
    # The Kelvin sign folds to "k" under str.lower(); ASCII folding keeps it apart from "k".
    assert actor(comment_on("x", "\u212aelly"), {"logins": ["kelly"], "match": "sender"})["trusted"] is False


def test_an_empty_list_trusts_no_one_and_allow_all_everyone() -> None:
    body = comment_on("maintainer", "maintainer")
    assert actor(body, {"logins": [], "match": "sender"})["trusted"] is False
    assert actor(body, {"allow_all": True})["trusted"] is True
    assert actor({"sender": 5}, {"allow_all": True})["trusted"] is True


# --- the gate's decision, first in the composition ------------------------------------------------------------


def grant(**overrides: Any) -> Grant:
    base: dict[str, Any] = {
        "webhook_id": "wh_1",
        "owner_endpoint_id": "ep_a",
        "human_id": "hu_1",
        "source": "github",
        "target_queue": "work",
        "allowed_queues": ["triage"],
        "targets": [Target(endpoint_id="ep_a", scope_queues=["work"])],
    }
    base.update(overrides)
    return Grant(**base)


def envelope(body: Any, gate: Any, release: dict[str, Any] | None = None) -> dict[str, Any]:
    return build_envelope(
        source="github",
        webhook_id="wh_1",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={"x-github-event": "issue_comment"},
        body=json.dumps(body).encode(),
        trusted_actors=gate,
        release=release,
    )


async def _never(*_: Any) -> Evaluation:
    raise AssertionError("a rule was evaluated")


async def test_a_stranger_is_quarantined_with_no_rule_evaluated() -> None:
    gate = gated("both")
    g = grant(trusted_actors=gate, rules=[{"id": "all", "expr": "true", "action": {"queue": "work"}}])
    env = envelope(comment_on("stranger", "stranger"), gate)
    routed = await route(g, env, _never)
    assert routed.decision.disposition == "quarantined"
    assert routed.decision.todos == []
    assert routed.decision.trace == {
        "stage": "trust_gate",
        "cause": "untrusted_actor",
        "actor": {
            "sender": "stranger",
            "author": "stranger",
            "sender_trusted": False,
            "author_trusted": False,
            "trusted": False,
        },
    }
    assert quarantine_reason(routed.decision.trace) == "untrusted_actor"


async def test_a_maintainer_and_a_release_go_to_the_rules() -> None:
    gate = gated("both")
    g = grant(trusted_actors=gate)
    assert gate_decision(g, envelope(comment_on("maintainer", "maintainer"), gate)) is None
    released = envelope(comment_on("stranger", "stranger"), gate, {"by": "endpoint:ep_a", "at": "2026-01-01T00:00:00Z"})
    assert gate_decision(g, released) is None
    assert released["actor"]["trusted"] is False  # the release admits it; the actor is still who it is
    # Without a gate nothing is held, and a gated delivery without an envelope is held, never let through.
    assert gate_decision(grant(), envelope(comment_on("stranger", "stranger"), None)) is None
    held = gate_decision(g, None)
    assert held is not None and held.trace["actor"] is None


def test_a_rule_and_a_default_that_quarantine() -> None:
    rules = [{"id": "hold-prs", "name": "PRs wait", "expr": "true", "action": {"quarantine": True}}]
    d = decide(grant(rules=rules), Evaluation(matched_index=0))
    assert (d.disposition, d.todos) == ("quarantined", [])
    assert d.trace == {
        "stage": "rule",
        "rule_index": 0,
        "rule_id": "hold-prs",
        "rule_name": "PRs wait",
        "action": {"quarantine": True},
    }
    assert quarantine_reason(d.trace) == "rule_action"
    d = decide(grant(default_action={"quarantine": True}), Evaluation())
    assert (d.disposition, d.trace["stage"], d.trace["cause"]) == ("quarantined", "default", "no_match_default")
    assert d.once_key is None and d.work_order is None


def test_quarantine_is_an_action_and_not_a_queue_name() -> None:
    assert parse_action({"quarantine": True}) == {"quarantine": True}
    for bad in ({"quarantine": False}, {"quarantine": True, "once": True}, {"quarantine": True, "drop": True}):
        with pytest.raises(ValueError):
            parse_action(bad)
    with pytest.raises(ValueError, match='"quarantine" is reserved'):
        parse_action({"queue": "quarantine"})
    g = grant(allowed_queues=["quarantine"])
    with pytest.raises(RuleValidationError) as info:
        validate_default_action({"queue": "quarantine"}, g)
    assert info.value.code == "invalid_rule"
    # A stored row that bypassed validation gets no queue of that name either: it takes the default.
    stored = [{"id": "q", "expr": "true", "action": {"queue": "quarantine"}}]
    d = decide(grant(allowed_queues=["quarantine"], rules=stored), Evaluation(matched_index=0))
    assert (d.trace["cause"], [t.queue for t in d.todos]) == ("rule_not_granted", ["work"])
    assert compiled_here(stored)  # the expression itself is fine: only the queue name is refused


def test_work_orders_carry_author_trusted_and_released_by() -> None:
    gate = gated("author")
    env = envelope(comment_on("maintainer", "maintainer"), gate, {"by": "endpoint:ep_a", "at": "t"})
    order = build_work_order(
        lane="work", source="github", webhook_id="wh_1", trust_mode="signed", verified=True, stage="rule", envelope=env
    )
    assert (order["author_trusted"], order["released_by"]) == (True, "endpoint:ep_a")
    plain = build_work_order(
        lane="work", source="github", webhook_id="wh_1", trust_mode="signed", verified=True, stage="rule"
    )
    assert (plain["author_trusted"], plain["released_by"]) == (None, None)
