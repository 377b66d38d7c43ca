"""on_fault through the real receiver: "continue" is SPEC-0020's no-match, "hold" stores the event as faulted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from routing.delivery import workflow_id_for
from tests.api.test_routing_scenarios import RUNAWAY, event_row, fleet, labeled, setup
from tests.conftest import Agent, Stack
from tests.helpers import eventually, issue_payload, post_github
from tests.workflows.replay import handle_for, replay_and_keep

ERRORS = {"id": "boom", "name": "gate that errors", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}
LOOPS = {"id": "loops", "expr": RUNAWAY, "action": {"drop": True}}
ISSUES = {"X-GitHub-Event": "issues"}
LANE = {"id": "lane", "expr": ".issue != null", "action": {"queue": "triage", "exclusive": True, "once": True}}


async def decision_attribute(stack: Stack, webhook_id: str, delivery: str) -> str | None:
    handle = stack.temporal.get_workflow_handle(workflow_id_for(webhook_id, f"{webhook_id}:{delivery}"))
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    value = attrs.get("SwitchboardDecision")
    return value if isinstance(value, str) else None


def counts(stack: Stack) -> tuple[int, int, int]:
    return (
        stack.sql("SELECT count(*) FROM events")[0][0],
        stack.sql("SELECT count(*) FROM todos")[0][0],
        stack.sql("SELECT count(*) FROM routing_once")[0][0],
    )


async def gated(stack: Stack, gate: dict[str, Any], on_fault: str | None) -> tuple[Agent, dict[str, Any]]:
    owner, webhook, _ = await setup(stack, lanes=["triage"])
    body: dict[str, Any] = {"webhook_id": webhook["webhook_id"], "rules": [gate, LANE]}
    if on_fault is not None:
        body["on_fault"] = on_fault
    saved = await owner.ok("set_webhook_rules", body)
    assert saved["on_fault"] == (on_fault or "continue")
    return owner, webhook


async def test_hold_stores_a_faulted_event_mints_nothing_and_a_redelivery_stays_faulted(stack: Stack) -> None:
    owner, webhook = await gated(stack, ERRORS, "hold")
    wid = webhook["webhook_id"]
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="held-1")
    assert resp.status_code == 202
    body = resp.json()
    assert body == {
        "event_id": body["event_id"],
        "todos": [],
        "created": 0,
        "faulted": True,
        "verified": True,
        "trust_mode": "signed",
    }
    disposition, trace, todo_ids = event_row(stack, body["event_id"])
    assert disposition == "faulted" and todo_ids == []
    assert trace["stage"] == "fault" and trace["cause"] == "held_on_fault"
    assert trace["rule_index"] == 0 and trace["rule_id"] == "boom" and trace["rule_name"] == "gate that errors"
    assert [(f["rule_index"], f["rule_id"], f["cause"]) for f in trace["faults"]] == [(0, "boom", "error")]
    # The lane rule matched after the fault, but evaluation stopped at the fault: no todo, no once-key.
    assert counts(stack) == (1, 0, 0)
    assert await decision_attribute(stack, wid, "held-1") == "faulted"
    await replay_and_keep(handle_for(stack, wid, "held-1"), "route_delivery_on_fault_hold.json")

    # The owner switches back to continue; a redelivery still stays faulted (the dedup contract). The rule errors
    # on the stored event, so the save needs force (rule_faults_on_recent_events otherwise).
    await owner.ok(
        "set_webhook_rules", {"webhook_id": wid, "rules": [ERRORS, LANE], "on_fault": "continue", "force": True}
    )
    again = await post_github(stack.http, webhook, issue_payload(), delivery="held-1")
    assert again.status_code == 202
    assert again.json() == {**body, "duplicate": True}
    assert counts(stack) == (1, 0, 0)

    # Under continue the same fault is a no-match and the lane rule mints (SPEC-0020, unchanged).
    routed = await post_github(stack.http, webhook, issue_payload(), delivery="continue-1")
    assert routed.json()["created"] == 1 and "faulted" not in routed.json()
    disposition, trace, _ = event_row(stack, routed.json()["event_id"])
    assert disposition == "routed" and trace["rule_id"] == "lane" and trace["faults"][0]["cause"] == "error"
    assert await decision_attribute(stack, wid, "continue-1") == "routed"

    # Event history shows the held delivery and filters on it.
    listed = await owner.ok("list_webhook_events", {"webhook_id": wid, "disposition": "faulted"})
    assert [e["id"] for e in listed["events"]] == [body["event_id"]]
    assert listed["events"][0]["routing"]["cause"] == "held_on_fault"
    got = await owner.ok("get_webhook_event", {"event_id": body["event_id"]})
    assert got["disposition"] == "faulted" and got["routing"]["faults"][0]["rule_id"] == "boom"


async def test_a_looping_rule_holds_under_hold_and_falls_through_under_continue(stack: Stack) -> None:
    _, cont = await gated(stack, LOOPS, None)
    body = (await post_github(stack.http, cont, issue_payload(), delivery="loop-c")).json()
    assert body["created"] == 1
    assert event_row(stack, body["event_id"])[1]["faults"][0]["cause"] == "timeout"

    _, hold = await gated(stack, LOOPS, "hold")
    before = counts(stack)
    body = (await post_github(stack.http, hold, issue_payload(), delivery="loop-h")).json()
    assert body["faulted"] is True and body["created"] == 0 and body["todos"] == []
    disposition, trace, _ = event_row(stack, body["event_id"])
    assert disposition == "faulted" and trace["rule_id"] == "loops" and trace["faults"][0]["cause"] == "timeout"
    assert counts(stack) == (before[0] + 1, before[1], before[2])
    assert await decision_attribute(stack, hold["webhook_id"], "loop-h") == "faulted"


async def test_a_compile_error_stored_by_sql_holds(stack: Stack) -> None:
    _, webhook = await gated(stack, ERRORS, "hold")
    wid = webhook["webhook_id"]
    broken = {"id": "typo", "expr": ".issue | (((", "action": {"drop": True}}
    # An operator write that bypasses save-time validation (ADR-0025's interim path).
    stack.sql("UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s", Jsonb([broken, LANE]), wid)
    body = (await post_github(stack.http, webhook, issue_payload(), delivery="ce-1")).json()
    assert body["faulted"] is True
    disposition, trace, _ = event_row(stack, body["event_id"])
    assert disposition == "faulted" and trace["rule_id"] == "typo"
    assert trace["faults"][0]["cause"] == "compile_error"
    assert counts(stack)[1:] == (0, 0)
    stack.sql("UPDATE endpoint_webhooks SET routing_on_fault = 'continue' WHERE id = %s", wid)
    body = (await post_github(stack.http, webhook, issue_payload(), delivery="ce-2")).json()
    assert body["created"] == 1


async def test_rule_verbs_preserve_on_fault_and_refuse_other_values(stack: Stack) -> None:
    owner, webhook = await gated(stack, ERRORS, "hold")
    wid = webhook["webhook_id"]

    def stored() -> str:
        return str(stack.sql("SELECT routing_on_fault FROM endpoint_webhooks WHERE id = %s", wid)[0][0])

    assert (await owner.ok("list_webhook_rules", {"webhook_id": wid}))["on_fault"] == "hold"
    added = await owner.ok(
        "add_webhook_rule", {"webhook_id": wid, "rule": {"id": "x", "expr": "false", "action": {"drop": True}}}
    )
    assert added["on_fault"] == "hold"
    updated = await owner.ok("update_webhook_rule", {"webhook_id": wid, "rule_id": "x", "rule": {"name": "never"}})
    assert updated["on_fault"] == "hold"
    moved = await owner.ok("move_webhook_rule", {"webhook_id": wid, "rule_id": "x", "position": 0})
    assert moved["on_fault"] == "hold" and [r["id"] for r in moved["rules"]] == ["x", "boom", "lane"]
    removed = await owner.ok("remove_webhook_rule", {"webhook_id": wid, "rule_id": "x"})
    assert removed["on_fault"] == "hold" and removed["removed"] is True
    # A set that omits on_fault keeps it: a careless save never loosens a hold.
    kept = await owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [ERRORS, LANE]})
    assert kept["on_fault"] == "hold" and stored() == "hold"

    for bad in ("HOLD", "drop", "", 1, True, None, ["hold"], {"hold": True}):
        if bad is None:
            continue  # null means "keep the saved value"
        for verb, extra in (("set_webhook_rules", {"rules": [ERRORS]}), ("test_webhook_rules", {"payload": {}})):
            resp = await owner.call(verb, {"webhook_id": wid, **extra, "on_fault": bad})
            assert resp.status_code == 422, (verb, bad, resp.text)
            assert resp.json()["error"]["code"] == "invalid_argument"
    assert stored() == "hold"
    assert [r["id"] for r in (await owner.ok("list_webhook_rules", {"webhook_id": wid}))["rules"]] == ["boom", "lane"]

    relaxed = await owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [ERRORS, LANE], "on_fault": "continue"})
    assert relaxed["on_fault"] == "continue" and stored() == "continue"


async def test_dry_run_and_backtest_apply_on_fault(stack: Stack) -> None:
    owner, webhook = await gated(stack, ERRORS, None)
    wid = webhook["webhook_id"]
    sample = issue_payload()

    saved = await owner.ok("test_webhook_rules", {"webhook_id": wid, "payload": sample, "omit_envelope": True})
    assert saved["decision"]["disposition"] == "routed" and saved["candidate"] is False
    held = await owner.ok(
        "test_webhook_rules", {"webhook_id": wid, "payload": sample, "on_fault": "hold", "omit_envelope": True}
    )
    assert held["candidate"] is True
    assert held["decision"] == {
        "disposition": "faulted",
        "drop": False,
        "queue": None,
        "endpoints": [],
        "once_key": None,
        "work_order": None,
    }
    assert held["trace"]["stage"] == "fault" and held["trace"]["rule_id"] == "boom"
    assert (await owner.ok("list_webhook_rules", {"webhook_id": wid}))["on_fault"] == "continue"

    # One stored routed event, then one stored faulted event under a saved hold.
    routed = (await post_github(stack.http, webhook, sample, delivery="bt-1")).json()
    # The erroring gate faults on that stored event: saved on purpose, with force.
    await owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [ERRORS, LANE], "on_fault": "hold", "force": True})
    faulted = (await post_github(stack.http, webhook, labeled(8), delivery="bt-2")).json()
    assert routed["created"] == 1 and faulted["faulted"] is True
    dry = await owner.ok(
        "test_webhook_rules", {"webhook_id": wid, "event_id": routed["event_id"], "omit_envelope": True}
    )
    assert dry["decision"]["disposition"] == "faulted"

    report = await owner.ok("backtest_webhook_rules", {"webhook_id": wid})
    by_id = {e["event_id"]: e for e in report["events"]}
    assert by_id[faulted["event_id"]]["stored"]["disposition"] == "faulted"
    assert by_id[faulted["event_id"]]["stored"]["rule_id"] == "boom"
    assert {e["candidate"]["disposition"] for e in report["events"]} == {"faulted"}
    assert by_id[routed["event_id"]]["changed"] is True
    assert report["summary"]["by_decision"] == {"faulted": 2}
    assert report["summary"]["stored_by_decision"] == {"routed": 1, "faulted": 1}
    assert report["summary"]["transitions"] == {"routed→faulted": 1}
    # A candidate continue shows what the saved hold prevents.
    relaxed = await owner.ok("backtest_webhook_rules", {"webhook_id": wid, "on_fault": "continue"})
    assert relaxed["summary"]["by_decision"] == {"routed": 2}
    assert counts(stack) == (2, 1, 1)


# ---------------------------------------------------------------------------------------------------
# The shipped packs fail closed when a gate faults (they set on_fault "hold").
# ---------------------------------------------------------------------------------------------------


def replace_rule_expr(stack: Stack, webhook_id: str, rule_id: str, expr: str) -> None:
    [(rules,)] = stack.sql("SELECT routing_rules FROM endpoint_webhooks WHERE id = %s", webhook_id)
    for rule in rules:
        if rule["id"] == rule_id:
            rule["expr"] = expr
    stack.sql("UPDATE endpoint_webhooks SET routing_rules = %s WHERE id = %s", Jsonb(rules), webhook_id)


async def test_fleet_fails_closed_when_the_author_gate_faults(stack: Stack) -> None:
    router, webhook, lanes = await fleet(stack, "github")
    wid = webhook["webhook_id"]
    assert (await router.ok("list_webhook_rules", {"webhook_id": wid}))["on_fault"] == "hold"
    untrusted = labeled(31, "size/S")
    untrusted["issue"]["user"]["login"] = "mallory"

    # The dry-run with the gate replaced by a looping candidate already shows the hold.
    rules = (await router.ok("list_webhook_rules", {"webhook_id": wid}))["rules"]
    candidate = [{**r, "expr": RUNAWAY} if r["id"] == "untrusted-author" else r for r in rules]
    dry = await router.ok(
        "test_webhook_rules",
        {"webhook_id": wid, "rules": candidate, "payload": untrusted, "headers": ISSUES, "omit_envelope": True},
    )
    assert dry["decision"]["disposition"] == "faulted" and dry["trace"]["rule_id"] == "untrusted-author"
    # The same candidate under continue would mint a lane-s work order for the untrusted author.
    dry_continue = await router.ok(
        "test_webhook_rules",
        {
            "webhook_id": wid,
            "rules": candidate,
            "payload": untrusted,
            "headers": ISSUES,
            "on_fault": "continue",
            "omit_envelope": True,
        },
    )
    assert dry_continue["decision"]["queue"] == "lane-s"

    replace_rule_expr(stack, wid, "untrusted-author", RUNAWAY)
    resp = await post_github(stack.http, webhook, untrusted, delivery="fleet-fault")
    assert resp.status_code == 202 and resp.json()["faulted"] is True and resp.json()["todos"] == []
    disposition, trace, _ = event_row(stack, resp.json()["event_id"])
    assert disposition == "faulted" and trace["rule_id"] == "untrusted-author"
    assert trace["faults"][0]["cause"] == "timeout"
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 0
    assert stack.sql("SELECT count(*) FROM routing_once")[0][0] == 0
    lane = await lanes["lane-s"].ok("list_todos", {})
    assert lane["todos"] == []
    listed = await router.ok("list_webhook_events", {"webhook_id": wid, "disposition": "faulted"})
    assert [e["id"] for e in listed["events"]] == [resp.json()["event_id"]]
    assert await decision_attribute(stack, wid, "fleet-fault") == "faulted"


async def test_pool_review_fails_closed_when_the_own_pr_gate_faults(stack: Stack) -> None:
    from cli.packs import load_pack

    agent = await stack.agent(queues=["review"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "review"})
    wid = webhook["webhook_id"]
    installed = await agent.ok(
        "set_webhook_rules", {"webhook_id": wid, **load_pack("pool-review", params=["identity=joestump"])}
    )
    assert installed["on_fault"] == "hold"
    replace_rule_expr(stack, wid, "own-pr-review-trigger", RUNAWAY)
    own = {
        "action": "opened",
        "pull_request": {"number": 5, "user": {"login": "joestump"}},
        "repository": {"full_name": "acme/app"},
        "sender": {"login": "joestump"},
    }
    resp = await post_github(stack.http, webhook, own, event="pull_request", delivery="pool-fault")
    body = resp.json()
    assert resp.status_code == 202 and body["faulted"] is True and body["created"] == 0, body
    disposition, trace, _ = event_row(stack, body["event_id"])
    assert disposition == "faulted" and trace["rule_id"] == "own-pr-review-trigger"
    assert stack.sql("SELECT count(*) FROM todos")[0][0] == 0
    assert await decision_attribute(stack, wid, "pool-fault") == "faulted"
    assert trace["faults"][0]["cause"] == "timeout"


async def test_a_rule_fault_is_logged_with_the_rule_and_cause_never_the_detail(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="temporalio.activity")
    _, webhook = await gated(stack, ERRORS, None)
    resp = await post_github(stack.http, webhook, issue_payload(), delivery="logged-1")
    assert resp.status_code == 202
    event_id = resp.json()["event_id"]
    _, trace, _ = event_row(stack, event_id)
    [fault] = trace["faults"]
    assert fault["detail"]  # the jq error message is on the trace

    def fault_lines() -> list[str] | None:
        lines = [
            r.getMessage() for r in caplog.records if r.getMessage().startswith(f"rule faults on event {event_id}")
        ]
        return lines or None

    [line] = await eventually(fault_lines)
    # The SDK logger appends the activity context after the message.
    assert line.startswith(f'rule faults on event {event_id}: rule index 0 (id "boom"): error (')
    assert fault["detail"] not in line
