"""Re-routing stored events through the real receiver, worker and RouteDelivery: one event, and in bulk."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from cli.client import CliError
from cli.main import build_parser
from routing.reroute import RerouteEventsInput
from tests.conftest import Agent, Stack
from tests.helpers import eventually, issue_payload, post_github
from workflows.reroute import RerouteEvents, batch_workflow_id

DROP_ISSUES = {"id": "drop-issues", "expr": '.kind == "issues"', "action": {"drop": True}}
DROP_PUSH = {"id": "drop-push", "expr": '.kind == "push"', "action": {"drop": True}}
ERRORS = {"id": "boom", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}
ONCE = {"id": "lane", "expr": ".issue != null", "action": {"queue": "work", "once": True, "work_order": True}}


async def _webhook(agent: Agent, rules: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules, **extra})
    return webhook


async def _deliver(stack: Stack, webhook: dict[str, Any], delivery: str, event: str = "issues", **p: Any) -> Any:
    resp = await post_github(stack.http, webhook, issue_payload(**p), delivery=delivery, event=event)
    assert resp.status_code == 202, resp.text
    return resp.json()


def _event(stack: Stack, event_id: str) -> dict[str, Any]:
    [(disposition, trace, todo_ids, reroute_of, external_id, received_at)] = stack.sql(
        "SELECT disposition, routing_trace, todo_ids, reroute_of, external_id, received_at FROM events WHERE id = %s",
        event_id,
    )
    return {
        "disposition": disposition,
        "trace": trace,
        "todo_ids": todo_ids,
        "reroute_of": reroute_of,
        "external_id": external_id,
        "received_at": received_at,
    }


def _counts(stack: Stack) -> tuple[int, int]:
    return stack.sql("SELECT count(*) FROM events")[0][0], stack.sql("SELECT count(*) FROM todos")[0][0]


async def test_a_dropped_delivery_rerouted_after_the_rule_is_removed_mints_one_todo_and_links_both_events(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [DROP_ISSUES])
    wid = webhook["webhook_id"]
    dropped = await _deliver(stack, webhook, "gh-1")
    assert dropped["dropped"] is True
    original = dropped["event_id"]
    before = _event(stack, original)
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": []})

    out = await agent.ok("reroute_webhook_event", {"event_id": original})
    result = out["result"]
    assert out["event_id"] == original and out["pending"] is False and out["dry_run"] is False
    assert result["status"] == "committed" and result["disposition"] == "routed" and result["created"] == 1
    [todo_ref] = result["todos"]
    assert todo_ref["created"] is True
    new = _event(stack, result["reroute_event_id"])
    assert new["reroute_of"] == original and new["disposition"] == "routed"
    assert new["trace"]["reroute_of"] == original and new["trace"]["stage"] == "default"
    assert new["todo_ids"] == [todo_ref["id"]] and new["received_at"] == before["received_at"]
    # The original never changes; its key is the todo's, the re-route's slot is its own.
    assert _event(stack, original) == before
    todo = (await agent.ok("get_todo", {"todo_id": todo_ref["id"]}))["todo"]
    assert todo["routing"]["reroute_of"] == original and todo["event_id"] == result["reroute_event_id"]
    assert todo["idempotency_key"] == before["external_id"] == f"{wid}:gh-1"
    assert new["external_id"].startswith(f"{wid}:gh-1#reroute:")

    # Again while that todo is live: a new event row that finds the live todo and mints nothing.
    again = (await agent.ok("reroute_webhook_event", {"event_id": result["reroute_event_id"]}))["result"]
    assert again["created"] == 0 and again["todos"] == [{**todo_ref, "created": False}]
    assert _event(stack, again["reroute_event_id"])["reroute_of"] == original  # always the original
    assert _counts(stack) == (3, 1)
    listed = await agent.ok("list_webhook_events", {"delivery_id": "gh-1"})
    assert {e["id"] for e in listed["events"]} == {original, result["reroute_event_id"], again["reroute_event_id"]}

    # Findable in the Temporal UI by the original event.
    runs = await eventually(
        lambda: _runs(stack, f"SwitchboardRerouteOf = '{original}'"),
        timeout=30,
    )
    assert sorted(runs) == sorted([out["workflow_id"], again["workflow_id"]])
    # A producer's redelivery of the original still answers what the original was.
    redelivered = await _deliver(stack, webhook, "gh-1")
    assert redelivered["dropped"] is True and redelivered["duplicate"] is True and _counts(stack) == (3, 1)


async def _runs(stack: Stack, query: str) -> list[str]:
    found = [w.id async for w in stack.temporal.list_workflows(query)]
    return found if len(found) >= 2 else []


async def test_a_completed_todo_does_not_hold_the_slot_and_a_reroute_while_the_rule_still_drops_stays_dropped(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [DROP_ISSUES])
    original = (await _deliver(stack, webhook, "gh-2"))["event_id"]
    still = (await agent.ok("reroute_webhook_event", {"event_id": original}))["result"]
    assert still["disposition"] == "dropped" and still["created"] == 0
    assert _event(stack, still["reroute_event_id"])["trace"]["rule_id"] == "drop-issues"
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": []})
    first = (await agent.ok("reroute_webhook_event", {"event_id": original}))["result"]
    todo_id = first["todos"][0]["id"]
    await agent.ok("claim", {"todo_id": todo_id})
    await agent.ok("complete", {"todo_id": todo_id})
    # The delivery's todo is done: an explicit re-route is new work.
    second = (await agent.ok("reroute_webhook_event", {"event_id": original}))["result"]
    assert second["created"] == 1 and second["todos"][0]["id"] != todo_id


async def test_a_faulted_event_is_rerouted_after_the_rule_is_fixed(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [ERRORS], on_fault="hold")
    held = await _deliver(stack, webhook, "gh-held")
    assert held["faulted"] is True and _counts(stack) == (1, 0)
    dry = await agent.ok("reroute_webhook_event", {"event_id": held["event_id"], "dry_run": True})
    assert dry["plan"]["stored"]["disposition"] == "faulted" and dry["plan"]["candidate"]["disposition"] == "faulted"
    assert dry["plan"]["changed"] is False and _counts(stack) == (1, 0)

    fixed = {**ERRORS, "expr": ".issue.number == 0"}
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": [fixed], "on_fault": "hold"})
    dry = await agent.ok("reroute_webhook_event", {"event_id": held["event_id"], "dry_run": True})
    assert dry["plan"]["candidate"]["disposition"] == "routed" and dry["plan"]["changed"] is True
    assert dry["plan"]["candidate"]["queue"] == "work" and dry["plan"]["candidate"]["endpoints"] == [agent.endpoint_id]
    assert _counts(stack) == (1, 0)  # a dry run writes nothing
    result = (await agent.ok("reroute_webhook_event", {"event_id": held["event_id"]}))["result"]
    assert result["disposition"] == "routed" and result["created"] == 1
    assert _event(stack, held["event_id"])["disposition"] == "faulted"


async def test_a_work_order_already_claimed_is_a_repeat_on_reroute(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [ONCE])
    first = await _deliver(stack, webhook, "gh-once-1")
    assert first["created"] == 1
    repeat = await _deliver(stack, webhook, "gh-once-2", action="labeled")
    assert repeat["repeat"] is True
    await agent.ok("claim", {"todo_id": first["todos"][0]["id"]})

    for event_id in (first["event_id"], repeat["event_id"]):
        dry = await agent.ok("reroute_webhook_event", {"event_id": event_id, "dry_run": True})
        assert dry["plan"]["candidate"]["disposition"] == "repeat"
        assert dry["plan"]["changed"] is False  # the work order is the delivery's own, or another's: no change
        result = (await agent.ok("reroute_webhook_event", {"event_id": event_id}))["result"]
        assert result["disposition"] == "repeat" and result["created"] == 0 and result["todos"] == []
        assert _event(stack, result["reroute_event_id"])["trace"]["once"] == "repeat"
    assert stack.sql("SELECT count(*) FROM routing_once") == [(1,)]
    assert stack.sql("SELECT count(*) FROM todos") == [(1,)]


async def test_another_humans_event_webhook_and_reroute_are_not_found(stack: Stack) -> None:
    owner = await stack.agent()
    sibling = await stack.agent(owner.human_id)  # the same human's other endpoint may re-route
    stranger = await stack.agent()
    webhook = await _webhook(owner, [DROP_ISSUES])
    event_id = (await _deliver(stack, webhook, "gh-mine"))["event_id"]
    await owner.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": []})
    done = await sibling.ok("reroute_webhook_event", {"event_id": event_id, "wait_seconds": 30})
    before = _counts(stack)

    for body in ({"event_id": event_id}, {"event_id": event_id, "dry_run": True}, {"event_id": "ev_nope"}):
        resp = await stranger.call("reroute_webhook_event", body)
        assert resp.status_code == 404 and resp.json()["error"] == {"code": "not_found", "message": "unknown event"}
    for body in ({"webhook_id": webhook["webhook_id"]}, {"webhook_id": "wh_nope", "dry_run": True}):
        resp = await stranger.call("reroute_webhook_events", body)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    for workflow_id in (done["workflow_id"], "reroute-ev_nope-0", "delivery-x", "switchboard-reaper-x"):
        resp = await stranger.call("get_reroute", {"workflow_id": workflow_id})
        assert resp.status_code == 404 and resp.json()["error"] == {"code": "not_found", "message": "unknown re-route"}
    assert _counts(stack) == before
    # Not a re-route at all: the original delivery's own run is not get_reroute's either.
    mine = await owner.ok("get_reroute", {"workflow_id": done["workflow_id"]})
    assert mine["kind"] == "event" and mine["status"] == "completed" and mine["result"]["created"] == 1


async def test_a_deleted_webhooks_events_cannot_be_rerouted(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [DROP_ISSUES])
    event_id = (await _deliver(stack, webhook, "gh-del"))["event_id"]
    await agent.ok("delete_webhook", {"webhook_id": webhook["webhook_id"]})
    for verb, body in (
        ("reroute_webhook_event", {"event_id": event_id}),
        ("reroute_webhook_event", {"event_id": event_id, "dry_run": True}),
        ("reroute_webhook_events", {"webhook_id": webhook["webhook_id"]}),
    ):
        resp = await agent.call(verb, body)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict", verb
    assert _counts(stack) == (1, 0)


async def _mixed(stack: Stack, agent: Agent) -> tuple[dict[str, Any], list[str], list[str]]:
    """A webhook with three dropped pushes and two routed issues; then the drop rule is removed."""
    webhook = await _webhook(agent, [DROP_PUSH])
    dropped = [(await _deliver(stack, webhook, f"push-{i}", event="push"))["event_id"] for i in range(3)]
    routed = [(await _deliver(stack, webhook, f"issue-{i}", number=i + 1))["event_id"] for i in range(2)]
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": []})
    return webhook, dropped, routed


async def test_bulk_dry_run_reports_exactly_the_dropped_events_and_mints_nothing_then_the_apply_mints_one_each(
    stack: Stack,
) -> None:
    agent = await stack.agent()
    webhook, dropped, routed = await _mixed(stack, agent)
    wid = webhook["webhook_id"]
    before = _counts(stack)
    assert before == (5, 2)

    dry = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "dry_run": True})
    assert dry["status"] == "planned" and dry["workflow_id"] is None
    assert dry["matched"] == 5 and dry["changed"] == 3
    assert {e["event_id"] for e in dry["events"] if e["changed"]} == set(dropped)
    assert [e["event_id"] for e in dry["events"]] == [*routed[::-1], *dropped[::-1]]  # newest first
    for row in dry["events"]:
        if row["changed"]:
            assert row["stored"]["disposition"] == "dropped" and row["candidate"]["disposition"] == "routed"
    only = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "dry_run": True, "disposition": "dropped"})
    assert [e["event_id"] for e in only["events"]] == dropped[::-1] and only["changed"] == 3
    by_rule = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "dry_run": True, "rule_id": "drop-push"})
    assert by_rule["matched"] == 3
    by_kind = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "dry_run": True, "kind": "issues"})
    assert by_kind["matched"] == 2 and by_kind["changed"] == 0
    assert (
        _counts(stack) == before
        and [w async for w in stack.temporal.list_workflows(f"WorkflowId STARTS_WITH 'reroute-batch-{wid}'")] == []
    )

    applied = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "wait_seconds": 60})
    assert applied["status"] == "completed" and applied["matched"] == 5 and applied["changed"] == 3
    assert applied["created"] == 3
    progress = applied["progress"]
    assert progress["total"] == progress["done"] == 3 and progress["failed"] == 0
    assert sorted(r["event_id"] for r in progress["results"]) == sorted(dropped)
    assert [r["event_id"] for r in progress["results"]] == dropped  # oldest first
    for r in progress["results"]:
        assert r["disposition"] == "routed" and r["created"] == 1
        assert _event(stack, r["reroute_event_id"])["reroute_of"] == r["event_id"]
    assert _counts(stack) == (8, 5)
    for event_id in dropped:
        assert _event(stack, event_id)["disposition"] == "dropped"

    # The dropped deliveries are routed now: a second bulk finds nothing to change and starts nothing.
    again = await agent.ok("reroute_webhook_events", {"webhook_id": wid})
    assert again["changed"] == 0 and again["workflow_id"] is None and again["status"] == "completed"
    still = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "dry_run": True, "disposition": "dropped"})
    assert still["matched"] == 0
    assert _counts(stack) == (8, 5)
    polled = await agent.ok("get_reroute", {"workflow_id": applied["workflow_id"]})
    assert polled["kind"] == "events" and polled["status"] == "completed"
    assert polled["progress"] == progress


async def test_bulk_answers_running_and_get_reroute_polls_it_to_the_end(stack: Stack) -> None:
    agent = await stack.agent()
    webhook, dropped, _ = await _mixed(stack, agent)
    started = await agent.ok("reroute_webhook_events", {"webhook_id": webhook["webhook_id"], "wait_seconds": 0})
    assert started["status"] == "running" and started["workflow_id"] == f"reroute-batch-{webhook['webhook_id']}"

    async def finished() -> dict[str, Any] | None:
        got = await agent.ok("get_reroute", {"workflow_id": started["workflow_id"]})
        assert got["status"] in ("running", "completed")
        return got if got["status"] == "completed" else None

    done = await eventually(finished, timeout=60, interval=0.3)
    assert done["progress"]["created"] == 3 and done["progress"]["done"] == 3
    assert {r["event_id"] for r in done["progress"]["results"]} == set(dropped)
    # Each child run is findable by its original event.
    for r in done["progress"]["results"]:
        found = [w.id async for w in stack.temporal.list_workflows(f"SwitchboardRerouteOf = '{r['event_id']}'")]
        assert found == [r["workflow_id"]]


async def test_bad_reroute_input_is_invalid_argument(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await _webhook(agent, [])
    for verb, body in (
        ("reroute_webhook_events", {"webhook_id": webhook["webhook_id"], "limit": 201}),
        ("reroute_webhook_events", {"webhook_id": webhook["webhook_id"], "limit": 0}),
        ("reroute_webhook_events", {"webhook_id": webhook["webhook_id"], "disposition": "lost"}),
        ("reroute_webhook_event", {"event_id": "ev_1", "wait_seconds": 61}),
        ("reroute_webhook_event", {}),
        ("get_reroute", {}),
    ):
        resp = await agent.call(verb, body)
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument", (verb, body)


async def test_the_cli_wraps_the_reroute_and_todo_verbs(live_stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    stack = live_stack
    agent = await stack.agent()
    webhook, dropped, _ = await _mixed(stack, agent)

    async def run(*argv: str) -> tuple[int, Any]:
        args = build_parser().parse_args([*argv, "--token", agent.credential, "--url", stack.base_url])
        capsys.readouterr()
        code = await asyncio.to_thread(args.fn, args)
        printed = capsys.readouterr().out
        return code, json.loads(printed[printed.index("{") :]) if "{" in printed else None

    code, dry = await run("events", "reroute", dropped[0], "--dry-run")
    assert code == 0 and dry["dry_run"] is True and dry["plan"]["changed"] is True
    code, bulk = await run("events", "reroute", "--webhook", webhook["webhook_id"], "--disposition", "dropped")
    # The bulk answer may come back running; the command then polls get_reroute until it ends.
    assert code == 0 and bulk["status"] == "completed"
    created = bulk["progress"]["created"]
    assert created == 3
    code, polled = await run("events", "get-reroute", bulk["workflow_id"])
    assert code == 0 and polled["progress"]["created"] == 3
    assert (await run("events", "reroute"))[0] == 2  # neither an event nor a webhook

    todo_id = bulk["progress"]["results"][0]["todos"][0]["id"]
    code, canceled = await run("todos", "cancel", todo_id, "--reason", "not needed")
    assert code == 0 and canceled["todo"]["state"] == "canceled" and canceled["todo"]["cancel_reason"] == "not needed"
    # A refusal is one line with the API's code and exit status 1 (cli/client.py), printed by main().
    with pytest.raises(CliError) as refused:
        await run("todos", "retry", todo_id)
    assert refused.value.code == "conflict" and refused.value.exit_code == 1
    stack.sql("UPDATE todos SET state = 'failed', attempt = 5, next_retry_at = NULL WHERE id = %s", todo_id)
    code, retried = await run("todos", "retry", todo_id)
    assert code == 0 and retried["todo"]["state"] == "pending" and retried["todo"]["attempt"] == 0


async def test_one_bulk_reroute_of_a_webhook_runs_at_a_time(stack: Stack) -> None:
    agent = await stack.agent()
    webhook, dropped, _ = await _mixed(stack, agent)
    wid = webhook["webhook_id"]
    # A slow bulk re-route of the first two (one start every 5 s) holds the webhook's bulk workflow id.
    slow = await stack.temporal.start_workflow(
        RerouteEvents.run,
        RerouteEventsInput(webhook_id=wid, event_ids=dropped[:2], batch="slow", starts_per_second=0.2),
        id=batch_workflow_id(wid),
        task_queue=stack.settings.task_queue,
    )
    # A second one now would re-route what the first has not reached yet: refused, naming the running one.
    resp = await agent.call("reroute_webhook_events", {"webhook_id": wid, "wait_seconds": 0})
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "conflict"
    assert batch_workflow_id(wid) in resp.json()["error"]["message"]
    assert (await slow.result()).created == 2
    # Once it ended, the next bulk re-route runs under the same id and finds only the third still dropped.
    after = await agent.ok("reroute_webhook_events", {"webhook_id": wid, "wait_seconds": 60})
    assert after["changed"] == 1 and after["status"] == "completed" and after["created"] == 1
    assert [r["event_id"] for r in after["progress"]["results"]] == [dropped[2]]
