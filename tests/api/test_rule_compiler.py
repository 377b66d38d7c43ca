"""compile_webhook_rule (issue 13 item 5): grounded, validated as a save, previewed, never saved.

The model provider is outside the product, so it is a scripted fake OpenAI-compatible server here; the
database, the rule sandbox and Temporal are the suite's real ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from api.verbs.rule_compiler import INSTRUCTIONS
from routing.filters import language, to_jq
from switchboard.llm import DATA_CLOSE, DATA_OPEN
from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github
from tests.llm_fake import FakeProvider, Reply, fake_provider


def sent(provider: Scripted, index: int = -1) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(instructions, data document, response_format) of one recorded request."""
    body = provider.requests[index]
    system = [m["content"] for m in body["messages"] if m["role"] == "system"]
    user = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert len(system) == 1 and len(user) == 1
    inside = user[0].split(DATA_OPEN, 1)[1].rsplit(DATA_CLOSE, 1)[0]
    document: dict[str, Any] = json.loads(inside)
    return system[0], document, body["response_format"]


class Scripted:
    """The fake provider answering in order (a value as JSON content, a str verbatim), then "unsupported"."""

    def __init__(self, fake: FakeProvider) -> None:
        self.fake = fake
        self.answers: list[Any] = []
        fake.script = self._next

    def _next(self, _request: dict[str, Any]) -> Reply:
        answer = self.answers.pop(0) if self.answers else {"answer": {"type": "unsupported", "reason": "?"}}
        return Reply(raw_content=answer) if isinstance(answer, str) else Reply(answer=answer)

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.fake.requests


@pytest.fixture
def provider() -> Iterator[Scripted]:
    with fake_provider() as fake:
        yield Scripted(fake)


async def set_triage(agent: Agent, webhook_id: str, *, include_payload: bool, model: str = "m1") -> None:
    """The owner's triage configuration (the provider and model the compiler defaults to)."""
    await agent.ok(
        "set_llm_triage",
        {
            "webhook_id": webhook_id,
            "provider": "fake",
            "model": model,
            "queues": [{"queue": "work", "description": "the usual"}],
            "threshold": 0.5,
            "per_minute": 10,
            "per_day": 100,
            "include_payload": include_payload,
        },
    )


async def _setup(
    stack: Stack, provider: Scripted, *, include_payload: bool = False, triage: bool = True
) -> tuple[Agent, dict[str, Any], list[str]]:
    """An owner with a github webhook, three stored events, and (optionally) triage configured on the fake."""
    agent = await stack.agent(queues=["work"], webhook_queues=["work", "triage"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await stack.admin(
        "set_llm_provider",
        {
            "name": "fake",
            "base_url": provider.base_url,
            "api_key": "sk-fake",
            "timeout_seconds": 20,
            "models": ["m1", "m2"],
        },
    )
    if triage:
        await set_triage(agent, webhook["webhook_id"], include_payload=include_payload)
    ids = []
    labels = [[{"name": "bug"}], [{"name": "docs"}], [{"name": "bug"}, {"name": "p1"}]]
    for n, labelled in enumerate(labels, start=1):
        payload = issue_payload(number=n, title=f"issue {n}")
        payload["issue"]["labels"] = labelled
        payload["owner_marker"] = {"n": n}
        resp = await post_github(stack.http, webhook, payload, delivery=f"cmp-{n}")
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["event_id"])
    return agent, webhook, ids


def _stored(stack: Stack, webhook_id: str) -> tuple[Any, ...]:
    [row] = stack.sql(
        "SELECT routing_rules, routing_default_action, routing_params, routing_on_fault FROM endpoint_webhooks"
        " WHERE id = %s",
        webhook_id,
    )
    return row


BUG_FILTER = {
    "answer": {
        "type": "filter",
        "kinds": ["issues"],
        "where": {
            "op": "all",
            "of": [
                {"op": "eq", "path": ".payload.action", "value": "opened"},
                {"op": "in", "path": ".payload.issue.labels.name", "values": ["bug"]},
            ],
        },
        "action": {"queue": "triage"},
    }
}


async def test_a_sentence_compiles_to_a_previewed_rule_and_nothing_is_saved(stack: Stack, provider: Scripted) -> None:
    agent, webhook, ids = await _setup(stack, provider)
    wid = webhook["webhook_id"]
    before = (
        _stored(stack, wid),
        stack.sql("SELECT count(*) FROM events")[0][0],
        stack.sql("SELECT count(*) FROM todos"),
    )
    provider.answers.append(BUG_FILTER)
    sentence = "bug-labeled issues that are opened go to triage"

    out = await agent.ok("compile_webhook_rule", {"webhook_id": wid, "sentence": sentence})

    assert out["type"] == "filter" and out["provider"] == "fake" and out["model"] == "m1"
    assert out["grounding"] == {"events": 3, "paths": out["grounding"]["paths"], "values": False}
    assert out["answer"] == BUG_FILTER["answer"] and out["schedule"] is None and out["warnings"] == []
    rule = out["rule"]
    assert rule["name"] == sentence and rule["action"] == {"queue": "triage"}
    answer = language.parse_reply(BUG_FILTER)
    assert isinstance(answer, language.FilterAnswer) and rule["expr"] == to_jq.to_jq(answer)
    preview = out["preview"]
    assert preview["matched_event_ids"] == [ids[2], ids[0]] and preview["matched"] == 2 and preview["events"] == 3
    assert preview["summary"]["by_rule"] == {"default:no_match_default": 1, **preview["summary"]["by_rule"]}
    assert preview["summary"]["changed"] == 2 and preview["summary"]["transitions"] == {"routed→routed": 2}

    # The model saw the constant instructions; the sentence and the event-derived paths only as data.
    instructions, document, response_format = sent(provider)
    assert instructions == INSTRUCTIONS and sentence not in instructions
    assert document["sentence"] == sentence and document["granted_queues"] == ["work", "triage"]
    assert document["kinds_seen"] == ["issues"]
    assert ".payload.issue.labels.name" in {p["path"] for p in document["paths"]}
    schema = response_format["json_schema"]["schema"]
    assert ".payload.issue.labels.name" in schema["$defs"]["Eq"]["properties"]["path"]["enum"]
    assert schema["$defs"]["QueueTo"]["properties"]["queue"]["enum"] == ["work", "triage"]

    # Nothing saved: rules, default, params, on_fault, events and todos are as they were.
    after = _stored(stack, wid), stack.sql("SELECT count(*) FROM events")[0][0], stack.sql("SELECT count(*) FROM todos")
    assert after == before
    assert (await agent.ok("list_webhook_rules", {"webhook_id": wid}))["rules"] == []

    # The rule is what a save accepts, and routes as previewed.
    saved = await agent.ok("add_webhook_rule", {"webhook_id": wid, "rule": rule})
    dry = await agent.ok("test_webhook_rules", {"webhook_id": wid, "event_id": ids[0], "omit_envelope": True})
    assert dry["decision"]["queue"] == "triage" and dry["trace"]["rule_id"] == saved["rule_id"]


async def test_an_ungrounded_path_is_refused_naming_it(stack: Stack, provider: Scripted) -> None:
    agent, webhook, _ = await _setup(stack, provider)
    provider.answers.append(
        {
            "answer": {
                "type": "filter",
                "kinds": [],
                "where": {"op": "eq", "path": ".payload.issue.severity", "value": "high"},
                "action": {"queue": "triage"},
            }
        }
    )
    resp = await agent.call("compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "severe ones"})
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["code"] == "uncompilable" and '".payload.issue.severity"' in error["message"]
    assert _stored(stack, webhook["webhook_id"])[0] == []


@pytest.mark.parametrize(
    ("garbage", "status", "code", "says"),
    [
        ("not json at all {", 502, "llm_error", "not JSON"),
        ('{"queue": "billing", "confidence": 0.9, "reason": "x"}', 422, "uncompilable", "answer: Field required"),
        (
            '{"answer": {"type": "filter", "kinds": "issues", "where": null, "action": {"queue": "triage"}}}',
            422,
            "uncompilable",
            "answer.filter.kinds",
        ),
        (
            '{"answer": {"type": "filter", "kinds": [], "where": {"op": "regex", "path": ".kind"}, "action": {"drop": true}}}',
            422,
            "uncompilable",
            "does not fit the filter schema",
        ),
        ('{"answer": {"type": "unsupported", "reason": "needs judgement"}}', 422, "uncompilable", "needs judgement"),
    ],
)
async def test_a_bad_model_answer_is_a_clear_error_and_saves_nothing(
    stack: Stack, provider: Scripted, garbage: str, status: int, code: str, says: str
) -> None:
    agent, webhook, _ = await _setup(stack, provider)
    provider.answers.append(garbage)
    resp = await agent.call("compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "billing"})
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and says in error["message"], error
    assert _stored(stack, webhook["webhook_id"])[0] == []


async def test_a_queue_outside_the_grant_is_not_granted(stack: Stack, provider: Scripted) -> None:
    agent, webhook, _ = await _setup(stack, provider)
    provider.answers.append(
        {"answer": {"type": "filter", "kinds": ["issues"], "where": None, "action": {"queue": "admin"}}}
    )
    resp = await agent.call("compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "to admin"})
    assert resp.status_code == 403
    error = resp.json()["error"]
    assert error["code"] == "forbidden" and 'queue "admin" is not granted' in error["message"]
    assert _stored(stack, webhook["webhook_id"])[0] == []


async def test_a_time_sentence_comes_back_as_a_schedule_create_schedule_accepts(
    stack: Stack, provider: Scripted
) -> None:
    agent, webhook, _ = await _setup(stack, provider)
    provider.answers.append({"answer": {"type": "schedule", "cron": "0  9 * * 1-5", "timezone": "Europe/Berlin"}})
    out = await agent.ok(
        "compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "every weekday at 9am Berlin time"}
    )
    assert out["type"] == "schedule" and out["rule"] is None and out["preview"] is None
    suggestion = out["schedule"]
    assert suggestion == {
        "cron": "0 9 * * 1-5",
        "timezone": "Europe/Berlin",
        "webhook_id": webhook["webhook_id"],
        "title": "every weekday at 9am Berlin time",
    }
    assert stack.sql("SELECT count(*) FROM schedules")[0][0] == 0
    created = await agent.ok("create_schedule", suggestion)
    assert created["cron"] == "0 9 * * 1-5" and created["timezone"] == "Europe/Berlin"

    provider.answers.append({"answer": {"type": "schedule", "cron": "CRON_TZ=UTC 0 9 * * *", "timezone": "Mars/Base"}})
    bad = await agent.call("compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "daily"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "uncompilable"


async def test_another_tenants_webhook_is_not_found_and_never_reaches_the_model(
    stack: Stack, provider: Scripted
) -> None:
    _, webhook, _ = await _setup(stack, provider, include_payload=True)
    other = await stack.agent(await stack.human("mallory"), queues=["work"])
    # (The owner's deliveries fell to its triage stage, which asked the fake too: only new requests count.)
    asked = len(provider.requests)
    theirs = await other.call("compile_webhook_rule", {"webhook_id": webhook["webhook_id"], "sentence": "all"})
    unknown = await other.call("compile_webhook_rule", {"webhook_id": "wh_nope", "sentence": "all"})
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json() == unknown.json()
    assert len(provider.requests) == asked

    # The other tenant's own webhook grounds on its own events only, never the owner's, values allowed or not.
    own = await other.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await set_triage(other, own["webhook_id"], include_payload=True, model="m2")
    payload = issue_payload(number=99, title="mallory's")
    payload["mallory_only"] = {"marker": "m"}
    assert (await post_github(stack.http, own, payload)).status_code == 202
    provider.answers.append({"answer": {"type": "filter", "kinds": [], "where": None, "action": {"queue": "work"}}})
    out = await other.ok(
        "compile_webhook_rule",
        {"webhook_id": own["webhook_id"], "sentence": "all", "sample": 50},
    )
    assert out["grounding"] == {"events": 1, "paths": out["grounding"]["paths"], "values": True}
    assert out["warnings"] == ["the rule matches every event"]
    _, document, _ = sent(provider)
    text = json.dumps(document)
    assert ".payload.mallory_only.marker" in text and "mallory's" in text
    assert "owner_marker" not in text and "issue 1" not in text and webhook["webhook_id"] not in text


async def test_values_are_withheld_unless_the_owner_allowed_payload(stack: Stack, provider: Scripted) -> None:
    agent, webhook, _ = await _setup(stack, provider)
    wid = webhook["webhook_id"]
    provider.answers.append(BUG_FILTER)
    await agent.ok("compile_webhook_rule", {"webhook_id": wid, "sentence": "bugs"})
    _, document, _ = sent(provider)
    paths = {p["path"]: p["values"] for p in document["paths"]}
    assert paths[".payload.issue.labels.name"] is None and paths[".payload.issue.title"] is None
    assert paths['.headers["x-github-event"]'] is None
    assert paths[".kind"] == ["issues"] and paths[".source"] == ["github"]  # switchboard-derived, always shown
    assert "issue 1" not in json.dumps(document)

    await set_triage(agent, wid, include_payload=True)
    provider.answers.append(BUG_FILTER)
    allowed = await agent.ok("compile_webhook_rule", {"webhook_id": wid, "sentence": "bugs"})
    assert allowed["grounding"]["values"] is True
    _, document, _ = sent(provider)
    paths = {p["path"]: p["values"] for p in document["paths"]}
    assert sorted(paths[".payload.issue.labels.name"]) == ["bug", "docs", "p1"]

    # The egress decision names the triage provider: another provider gets paths only.
    await stack.admin("set_llm_provider", {"name": "other", "base_url": provider.base_url, "models": ["x"]})
    provider.answers.append(BUG_FILTER)
    elsewhere = await agent.ok(
        "compile_webhook_rule", {"webhook_id": wid, "sentence": "bugs", "provider": "other", "model": "x"}
    )
    assert elsewhere["grounding"]["values"] is False
    _, document, _ = sent(provider)
    assert {p["path"]: p["values"] for p in document["paths"]}[".payload.issue.labels.name"] is None


async def test_no_model_configured_is_invalid_argument(stack: Stack, provider: Scripted) -> None:
    agent, webhook, _ = await _setup(stack, provider, triage=False)
    wid = webhook["webhook_id"]
    for body in ({}, {"provider": "fake"}, {"model": "m1"}, {"provider": "nope", "model": "m1"}):
        resp = await agent.call("compile_webhook_rule", {"webhook_id": wid, "sentence": "bugs", **body})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument", (body, resp.text)
    unknown_model = await agent.call(
        "compile_webhook_rule", {"webhook_id": wid, "sentence": "bugs", "provider": "fake", "model": "gpt-x"}
    )
    assert unknown_model.status_code == 422 and "gpt-x" in unknown_model.json()["error"]["message"]
    assert provider.requests == []  # no triage stage here, so no delivery asked either
