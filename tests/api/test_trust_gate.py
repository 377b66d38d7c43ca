"""The trust gate end to end: gated webhooks, quarantine (by the gate, a rule or the default), release and dismiss,
the dry-run / backtest / re-route views of it, and saves refused when a rule faults on recent events."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from routing.backtest import RecentCheck
from routing.models import Grant
from routing.rules import Candidate
from store.models import Caller
from store.rules import RuleConfig
from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github, token_of
from tests.signing import sign_cairn
from tests.workflows.replay import decision_attribute, handle_for

MAINTAINERS = {"logins": ["Maintainer"], "match": "both"}
ALL_ISSUES = {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}
# Matches released work only: the recipe's way of admitting what a person let through.
RELEASED = {"id": "released", "expr": ".release != null", "action": {"queue": "work", "work_order": True}}


def by(login: str, **extra: Any) -> dict[str, Any]:
    """An issue opened (and sent) by ``login``."""
    payload = issue_payload(**extra)
    payload["issue"]["user"] = {"login": login}
    payload["sender"] = {"login": login}
    return payload


async def gated_hook(
    agent: Agent, rules: list[dict[str, Any]] | None = None, gate: Any = MAINTAINERS, **extra: Any
) -> dict[str, Any]:
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work", "trusted_actors": gate})
    if rules is not None or extra:
        await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": rules or [], **extra})
    return hook


async def deliver(stack: Stack, hook: dict[str, Any], payload: Any, delivery: str, event: str = "issues") -> Any:
    resp = await post_github(stack.http, hook, payload, delivery=delivery, event=event)
    assert resp.status_code == 202, resp.text
    return resp.json()


def event_row(stack: Stack, event_id: str) -> dict[str, Any]:
    [row] = stack.sql(
        "SELECT disposition, routing_trace, todo_ids, quarantine_state, reviewed_by, release_event_id, release,"
        " reroute_of FROM events WHERE id = %s",
        event_id,
    )
    keys = ("disposition", "trace", "todo_ids", "state", "reviewed_by", "release_event_id", "release", "reroute_of")
    return dict(zip(keys, row, strict=True))


def todos(stack: Stack) -> int:
    return int(stack.sql("SELECT count(*) FROM todos")[0][0])


def deliveries_counted(decision: str) -> float:
    return REGISTRY.get_sample_value("switchboard_deliveries_total", {"source": "github", "decision": decision}) or 0.0


# --- the gate -------------------------------------------------------------------------------------------------


async def test_a_strangers_issue_is_quarantined_with_no_rule_evaluated_and_a_maintainers_routes(stack: Stack) -> None:
    agent = await stack.agent()
    # A rule that would fault on every delivery under on_fault hold: it is never reached by a stranger's.
    boom = {"id": "boom", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}
    hook = await gated_hook(agent, [ALL_ISSUES, boom])
    counted = deliveries_counted("quarantined")

    held = await deliver(stack, hook, by("stranger"), "stranger-1")
    assert held["quarantined"] is True and held["todos"] == [] and held["created"] == 0
    assert "routing" not in held and "trace" not in held  # the producer never sees the trace
    row = event_row(stack, held["event_id"])
    assert row["disposition"] == "quarantined" and row["state"] == "held" and row["todo_ids"] == []
    assert row["trace"] == {
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
    assert todos(stack) == 0
    handle = handle_for(stack, hook["webhook_id"], "stranger-1")
    assert await decision_attribute(handle) == "quarantined"
    assert deliveries_counted("quarantined") == counted + 1

    routed = await deliver(stack, hook, by("MAINTAINER", number=8), "maintainer-1")
    assert routed["created"] == 1 and "quarantined" not in routed
    trace = event_row(stack, routed["event_id"])["trace"]
    assert trace["stage"] == "rule" and trace["rule_id"] == "issues"

    listed = await agent.ok("list_webhook_events", {"webhook_id": hook["webhook_id"], "disposition": "quarantined"})
    [shown] = listed["events"]
    assert shown["id"] == held["event_id"]
    assert shown["quarantine"] == {
        "state": "held",
        "reason": "untrusted_actor",
        "reviewed_by": None,
        "reviewed_at": None,
        "note": None,
        "release_event_id": None,
    }
    # The same human's other endpoint sees it too; its redelivery stays quarantined.
    other = await stack.agent(agent.human_id)
    assert [e["id"] for e in (await other.ok("list_webhook_events", {"disposition": "quarantined"}))["events"]] == [
        held["event_id"]
    ]
    again = await deliver(stack, hook, by("stranger"), "stranger-1")
    assert again["quarantined"] is True and again["duplicate"] is True and again["event_id"] == held["event_id"]


async def test_an_unreadable_stored_gate_trusts_no_one(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await gated_hook(agent, [ALL_ISSUES])
    # Written past the verbs, which would refuse it: a login list that is a string.
    stack.sql(
        "UPDATE endpoint_webhooks SET trusted_actors = %s::jsonb WHERE id = %s",
        json.dumps({"logins": "maintainer"}),
        hook["webhook_id"],
    )
    held = await deliver(stack, hook, by("maintainer"), "m-1")
    assert held["quarantined"] is True
    assert event_row(stack, held["event_id"])["trace"]["actor"]["trusted"] is False


async def test_a_comment_by_a_stranger_on_a_maintainers_issue_and_the_reverse(stack: Stack) -> None:
    agent = await stack.agent()
    outcomes: dict[tuple[str, str], bool] = {}
    for match in ("sender", "author", "both"):
        hook = await gated_hook(agent, [], gate={"logins": ["maintainer"], "match": match})
        for thread, commenter in (("maintainer", "stranger"), ("stranger", "maintainer")):
            payload = {
                "action": "created",
                "issue": {"number": 4, "user": {"login": thread}},
                "comment": {"id": 1, "user": {"login": commenter}},
                "repository": {"full_name": "acme/app"},
                "sender": {"login": commenter},
            }
            out = await deliver(stack, hook, payload, f"{match}-{thread}", event="issue_comment")
            outcomes[(match, commenter)] = out.get("quarantined", False)
    assert outcomes == {
        ("sender", "stranger"): True,
        ("sender", "maintainer"): False,
        ("author", "stranger"): True,
        ("author", "maintainer"): True,  # the thread is a stranger's
        ("both", "stranger"): True,
        ("both", "maintainer"): True,
    }


async def test_cairn_actor_ids_ignore_a_forged_on_behalf_of(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok(
        "create_webhook",
        {"source_type": "cairn", "target_queue": "work", "trusted_actors": {"actor_ids": ["joestump-agent"]}},
    )

    async def post(actor_id: str, on_behalf_of: str) -> dict[str, Any]:
        body = json.dumps(
            {
                "event_id": f"evt-{uuid.uuid4().hex[:8]}",
                "kind": "artifact.created",
                "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "data": {"id": uuid.uuid4().hex[:8], "actor_id": actor_id, "on_behalf_of": on_behalf_of},
            }
        ).encode()
        headers = {"Content-Type": "application/json", **sign_cairn(hook["secret"].encode(), body)}
        resp = await stack.http.post(f"/webhooks/w/{token_of(hook['ingest_url'])}", content=body, headers=headers)
        assert resp.status_code == 202, resp.text
        out: dict[str, Any] = resp.json()
        return out

    forged = await post("mallory", "joestump-agent")
    assert forged["quarantined"] is True
    actor = event_row(stack, forged["event_id"])["trace"]["actor"]
    assert (actor["sender"], actor["trusted"]) == ("mallory", False)
    trusted = await post("joestump-agent", "claude-code/2.1.0")
    assert trusted["created"] == 1


# --- trusted_actors: set at create, changed by its owner only ----------------------------------------------------


async def test_trusted_actors_are_validated_listed_and_owner_only(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    assert hook["trusted_actors"] is None
    resp = await agent.call("set_webhook_trusted_actors", {"webhook_id": wid, "trusted_actors": {"actor_ids": ["x"]}})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument"
    assert "trusts logins" in resp.json()["error"]["message"]
    refused = await agent.call(
        "create_webhook", {"source_type": "stripe", "target_queue": "work", "trusted_actors": {"allow_all": True}}
    )
    assert refused.status_code == 422

    out = await agent.ok("set_webhook_trusted_actors", {"webhook_id": wid, "trusted_actors": {"logins": ["a", "a"]}})
    assert out["trusted_actors"] == {"logins": ["a"], "match": "both"}
    [listed] = (await agent.ok("list_webhooks", {}))["webhooks"]
    assert listed["trusted_actors"] == {"logins": ["a"], "match": "both"}

    stranger = await stack.agent()
    for body in (
        {"webhook_id": wid, "trusted_actors": {"allow_all": True}},
        {"webhook_id": "wh_nope", "trusted_actors": None},
    ):
        resp = await stranger.call("set_webhook_trusted_actors", body)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert stack.sql("SELECT trusted_actors FROM endpoint_webhooks WHERE id = %s", wid) == [
        ({"logins": ["a"], "match": "both"},)
    ]
    cleared = await agent.ok("set_webhook_trusted_actors", {"webhook_id": wid, "trusted_actors": None})
    assert cleared["trusted_actors"] is None
    missing = await agent.call("set_webhook_trusted_actors", {"webhook_id": wid})
    assert missing.status_code == 422  # null is said on purpose, never by omission


# --- quarantine by a rule or the default ---------------------------------------------------------------------


async def test_a_rule_and_a_default_that_quarantine(stack: Stack) -> None:
    agent = await stack.agent()
    hold = {"id": "hold-prs", "expr": '.payload.action == "opened"', "action": {"quarantine": True}}
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [hold], "default_action": {"quarantine": True}})
    by_rule = await deliver(stack, hook, by("anyone"), "q-1")
    assert by_rule["quarantined"] is True and todos(stack) == 0
    trace = event_row(stack, by_rule["event_id"])["trace"]
    assert (trace["stage"], trace["rule_id"], trace["action"]) == ("rule", "hold-prs", {"quarantine": True})
    by_default = await deliver(stack, hook, by("anyone", action="edited"), "q-2")
    assert by_default["quarantined"] is True
    assert event_row(stack, by_default["event_id"])["trace"]["stage"] == "default"
    [shown] = (await agent.ok("list_webhook_events", {"webhook_id": wid, "quarantine_state": "held", "limit": 1}))[
        "events"
    ]
    assert shown["quarantine"]["reason"] == "rule_action"


async def test_quarantine_as_a_queue_name_is_refused(stack: Stack) -> None:
    agent = await stack.agent(queues=["work", "quarantine"])
    reserved = await agent.call("create_webhook", {"source_type": "github", "target_queue": "quarantine"})
    assert reserved.status_code == 422 and '"quarantine" is reserved' in reserved.json()["error"]["message"]
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    for body in (
        {"rules": [{"id": "q", "expr": "true", "action": {"queue": "quarantine"}}]},
        {"rules": [], "default_action": {"queue": "quarantine"}},
        {"rules": [{"id": "q", "expr": "true", "action": {"quarantine": True, "once": True}}]},
    ):
        resp = await agent.call("set_webhook_rules", {"webhook_id": hook["webhook_id"], **body})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_rule", resp.text
    assert (await agent.ok("list_webhook_rules", {"webhook_id": hook["webhook_id"]}))["rules"] == []


# --- release and dismiss -------------------------------------------------------------------------------------


async def test_release_mints_once_with_release_and_released_by_and_a_second_release_mints_nothing(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    hook = await gated_hook(agent, [RELEASED], default_action={"drop": True})
    held = await deliver(stack, hook, by("stranger"), "rel-1")
    assert held["quarantined"] is True

    out = await agent.ok("release_webhook_event", {"event_id": held["event_id"], "note": "looks fine"})
    review, result = out["review"], out["result"]
    assert review["state"] == "released" and review["reviewed_by"] == f"endpoint:{agent.endpoint_id}"
    assert review["note"] == "looks fine" and review["reason"] == "untrusted_actor"
    assert result["status"] == "committed" and result["disposition"] == "routed" and result["created"] == 1
    assert out["workflow_id"] == f"reroute-{held['event_id']}-release"
    released = event_row(stack, result["reroute_event_id"])
    assert released["reroute_of"] == held["event_id"] and released["trace"]["rule_id"] == "released"
    at = released["release"]["at"]
    assert released["release"] == {"by": f"endpoint:{agent.endpoint_id}", "at": at, "event_id": held["event_id"]}
    assert released["trace"]["release"] == released["release"]
    original = event_row(stack, held["event_id"])
    assert (original["disposition"], original["state"]) == ("quarantined", "released")
    assert original["release_event_id"] == result["reroute_event_id"]
    [ref] = result["todos"]
    todo = (await agent.ok("get_todo", {"todo_id": ref["id"]}))["todo"]
    assert todo["work_order"]["released_by"] == f"endpoint:{agent.endpoint_id}"
    assert todo["work_order"]["author_trusted"] is False
    # The rules saw .release, and the gate's verdict on the actor is unchanged.
    dry = await agent.ok(
        "test_webhook_rules", {"webhook_id": hook["webhook_id"], "event_id": result["reroute_event_id"]}
    )
    assert dry["envelope"]["release"] == {"by": f"endpoint:{agent.endpoint_id}", "at": at}
    assert dry["envelope"]["actor"]["trusted"] is False and dry["decision"]["disposition"] == "routed"

    # A second release, by another endpoint of the human: the same release, the same slot, nothing minted.
    other = await stack.agent(agent.human_id)
    again = await other.ok("release_webhook_event", {"event_id": held["event_id"]})
    assert again["review"]["reviewed_by"] == f"endpoint:{agent.endpoint_id}"
    assert again["result"]["created"] == 0 and again["result"]["reroute_event_id"] == result["reroute_event_id"]
    assert todos(stack) == 1
    assert stack.sql("SELECT count(*) FROM events WHERE reroute_of = %s", held["event_id"]) == [(1,)]
    # Released is final: it cannot be dismissed now.
    resp = await agent.call("dismiss_webhook_event", {"event_id": held["event_id"]})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"


async def test_dismiss_closes_without_routing_and_another_humans_event_is_not_found(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await gated_hook(agent, [ALL_ISSUES])
    first = await deliver(stack, hook, by("stranger"), "dis-1")
    second = await deliver(stack, hook, by("stranger", number=9), "dis-2")
    routed = await deliver(stack, hook, by("maintainer", number=10), "dis-3")

    stranger = await stack.agent()
    for verb in ("release_webhook_event", "dismiss_webhook_event"):
        for event_id in (first["event_id"], "ev_unknown"):
            resp = await stranger.call(verb, {"event_id": event_id})
            assert resp.status_code == 404 and resp.json()["error"] == {"code": "not_found", "message": "unknown event"}
    assert event_row(stack, first["event_id"])["state"] == "held"

    dismissed = await agent.ok("dismiss_webhook_event", {"event_id": first["event_id"], "note": "spam"})
    assert dismissed["state"] == "dismissed" and dismissed["note"] == "spam" and dismissed["release_event_id"] is None
    assert (await agent.ok("dismiss_webhook_event", {"event_id": first["event_id"]}))["note"] == "spam"
    resp = await agent.call("release_webhook_event", {"event_id": first["event_id"]})
    assert resp.status_code == 409 and "dismissed" in resp.json()["error"]["message"]
    resp = await agent.call("release_webhook_event", {"event_id": routed["event_id"]})
    assert resp.status_code == 409 and "routed, not quarantined" in resp.json()["error"]["message"]
    assert todos(stack) == 1  # the maintainer's, nothing else

    held = await agent.ok("list_webhook_events", {"webhook_id": hook["webhook_id"], "quarantine_state": "held"})
    assert [e["id"] for e in held["events"]] == [second["event_id"]]


# --- dry-run, backtest, re-route ---------------------------------------------------------------------------------


async def test_dry_run_backtest_and_reroute_show_the_gate(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [ALL_ISSUES]})
    stored = await deliver(stack, hook, by("stranger"), "old-1")
    assert stored["created"] == 1
    await agent.ok("set_webhook_trusted_actors", {"webhook_id": wid, "trusted_actors": MAINTAINERS})

    dry = await agent.ok(
        "test_webhook_rules", {"webhook_id": wid, "payload": by("stranger"), "headers": {"X-GitHub-Event": "issues"}}
    )
    assert dry["decision"]["disposition"] == "quarantined" and dry["trace"]["stage"] == "trust_gate"
    assert dry["envelope"]["actor"]["trusted"] is False and dry["envelope"]["release"] is None
    trusted = await agent.ok(
        "test_webhook_rules", {"webhook_id": wid, "payload": by("maintainer"), "headers": {"X-GitHub-Event": "issues"}}
    )
    assert trusted["decision"]["disposition"] == "routed" and trusted["envelope"]["actor"]["trusted"] is True
    released = await agent.ok(
        "test_webhook_rules", {"webhook_id": wid, "event_id": stored["event_id"], "released": True}
    )
    assert released["decision"]["disposition"] == "routed"
    assert released["envelope"]["release"]["by"] == f"endpoint:{agent.endpoint_id}"
    candidate = await agent.ok(
        "test_webhook_rules",
        {
            "webhook_id": wid,
            "payload": by("maintainer"),
            "headers": {"X-GitHub-Event": "issues"},
            "rules": [{"id": "hold", "expr": "true", "action": {"quarantine": True}}],
        },
    )
    assert candidate["decision"]["disposition"] == "quarantined" and candidate["trace"]["rule_id"] == "hold"

    backtest = await agent.ok("backtest_webhook_rules", {"webhook_id": wid})
    [row] = backtest["events"]
    assert (row["stored"]["disposition"], row["candidate"]["disposition"]) == ("routed", "quarantined")
    assert row["candidate"]["stage"] == "trust_gate" and row["changed"] is True
    assert backtest["summary"]["transitions"] == {"routed→quarantined": 1}

    plan = await agent.ok("reroute_webhook_event", {"event_id": stored["event_id"], "dry_run": True})
    assert plan["plan"]["candidate"]["disposition"] == "quarantined"
    out = await agent.ok("reroute_webhook_event", {"event_id": stored["event_id"]})
    assert out["result"]["disposition"] == "quarantined" and out["result"]["created"] == 0
    rerouted = event_row(stack, out["result"]["reroute_event_id"])
    assert (rerouted["state"], rerouted["trace"]["stage"]) == ("held", "trust_gate")
    # Released, the delivery's later re-routes carry the release: a person's decision is not undone by a re-route.
    await agent.ok("release_webhook_event", {"event_id": out["result"]["reroute_event_id"]})
    again = await agent.ok("reroute_webhook_event", {"event_id": stored["event_id"]})
    assert again["result"]["disposition"] == "routed"
    assert (
        event_row(stack, again["result"]["reroute_event_id"])["release"]["event_id"]
        == out["result"]["reroute_event_id"]
    )


# --- saves that would fault on real traffic -------------------------------------------------------------------


# Cheap on a small event, far past the 50 ms rule timeout on a 1 MB one (.size is the body's bytes).
SLOW_ON_BIG = {"id": "slow", "name": "counts the body", "expr": "[range(.size)] | length < 0", "action": {"drop": True}}


async def test_a_save_is_refused_when_a_rule_times_out_on_a_stored_1mb_event_and_saved_with_force(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    small = await deliver(stack, hook, by("someone"), "small-1")
    big = await deliver(stack, hook, by("someone", number=2, blob="a" * 1_000_000), "big-1")
    assert stack.sql("SELECT payload_size > 1000000 FROM events WHERE id = %s", big["event_id"]) == [(True,)]

    for verb, body in (
        ("set_webhook_rules", {"rules": [SLOW_ON_BIG]}),
        ("add_webhook_rule", {"rule": SLOW_ON_BIG}),
    ):
        resp = await agent.call(verb, {"webhook_id": wid, **body})
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "rule_faults_on_recent_events"
        assert error["message"].startswith('rule index 0 (id "slow", name "counts the body"): timeout on 1 of')
        assert big["event_id"] in error["message"] and small["event_id"] not in error["message"]
    rules = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert rules["rules"] == [] and rules["forced"] is None

    with caplog.at_level(logging.WARNING, logger="switchboard.rules"):
        forced = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [SLOW_ON_BIG], "force": True})
    assert [r["id"] for r in forced["rules"]] == ["slow"]
    record = forced["forced"]
    assert record["by"] == f"endpoint:{agent.endpoint_id}"
    assert record["faults"] == [
        {
            "rule_index": 0,
            "rule_id": "slow",
            "rule_name": "counts the body",
            "causes": ["timeout"],
            "events": 1,
            "event_ids": [big["event_id"]],
        }
    ]
    assert (await agent.ok("list_webhook_rules", {"webhook_id": wid}))["forced"] == record
    assert any(
        f"endpoint {agent.endpoint_id}" in r.getMessage() and big["event_id"] in r.getMessage() for r in caplog.records
    )
    # Every rule verb replays: a move of the saved list is refused the same way, and a clean save clears the record.
    resp = await agent.call("move_webhook_rule", {"webhook_id": wid, "rule_id": "slow", "position": 0})
    assert resp.json()["error"]["code"] == "rule_faults_on_recent_events"
    cleared = await agent.ok("remove_webhook_rule", {"webhook_id": wid, "rule_id": "slow"})
    assert cleared["rules"] == [] and cleared["forced"] is None


async def test_a_rule_that_errors_on_recent_events_is_refused_and_one_that_does_not_is_saved(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    # Before any event, nothing can fault: the save goes through.
    boom = {"id": "boom", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": []})
    delivered = [await deliver(stack, hook, by("someone", number=n), f"e-{n}") for n in range(1, 8)]
    resp = await agent.call("add_webhook_rule", {"webhook_id": wid, "rule": boom})
    error = resp.json()["error"]
    assert (
        error["code"] == "rule_faults_on_recent_events" and "error on 5 of the webhook's latest 5" in error["message"]
    )
    named = [e["event_id"] for e in delivered[::-1][:5]]
    assert f"({', '.join(named)})" in error["message"]  # the newest five, no more
    # A rule after a rule that matches every event is never reached, as on real traffic: nothing faults.
    first = {"id": "all", "expr": "true", "action": {"queue": "work"}}
    saved = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [first, boom]})
    assert [r["id"] for r in saved["rules"]] == ["all", "boom"] and saved["forced"] is None


async def test_a_save_replays_once_unless_a_concurrent_save_changed_the_rules(stack: Stack) -> None:
    agent = await stack.agent()
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = hook["webhook_id"]
    services = stack.app.state.services
    caller = Caller(
        endpoint_id=agent.endpoint_id,
        agent_id=agent.agent_id,
        human_id=agent.human_id,
        scope_queues=["work"],
        scope_verbs=[],
        webhook_max=5,
        webhook_source_types=["github"],
        webhook_queues=["work"],
    )
    vetted: list[list[str]] = []

    async def vet(grant: Grant) -> RecentCheck:
        vetted.append([r["expr"] for r in grant.rules])
        return RecentCheck()

    def edit(current: RuleConfig) -> Candidate:
        # No id: each validation pass mints its own, which must not count as a change.
        return Candidate(rules=[*current.rules, {"expr": ".verified", "action": {"queue": "work"}}])

    await services.rules.modify(caller, wid, edit, services.rule_sandbox, vet=vet)
    assert vetted == [[".verified"]]

    # A save that lands between the unlocked pass and the lock: the locked pass replays what it will save.
    sneaked: list[bool] = []

    async def vet_and_sneak(grant: Grant) -> RecentCheck:
        vetted.append([r["expr"] for r in grant.rules])
        if not sneaked:
            sneaked.append(True)
            await agent.ok(
                "set_webhook_rules", {"webhook_id": wid, "rules": [{"expr": "false", "action": {"drop": True}}]}
            )
        return RecentCheck()

    vetted.clear()
    await services.rules.modify(caller, wid, edit, services.rule_sandbox, vet=vet_and_sneak)
    assert vetted == [[".verified", ".verified"], ["false", ".verified"]]
