"""Rule verbs (SPEC-0020 "Rule Management Tools", "Routing Dry-Run") and the backtest, over HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github

RULE_VERBS = (
    "list_webhook_rules",
    "set_webhook_rules",
    "add_webhook_rule",
    "update_webhook_rule",
    "move_webhook_rule",
    "remove_webhook_rule",
    "test_webhook_rules",
    "backtest_webhook_rules",
)
MATCH_ALL = {"id": "all", "expr": "true", "action": {"queue": "work"}}


async def _webhook(agent: Agent, source_type: str = "github", queue: str = "work") -> dict[str, Any]:
    return await agent.ok("create_webhook", {"source_type": source_type, "target_queue": queue})


def _routed_endpoint(stack: Stack, webhook_id: str, endpoint_id: str) -> None:
    stack.sql("INSERT INTO webhook_routes (webhook_id, target_endpoint_id) VALUES (%s, %s)", webhook_id, endpoint_id)


def _stored_rules(stack: Stack, webhook_id: str) -> tuple[Any, Any, Any]:
    [row] = stack.sql(
        "SELECT routing_rules, routing_default_action, routing_params FROM endpoint_webhooks WHERE id = %s",
        webhook_id,
    )
    return row


async def test_set_and_list_return_the_full_configuration_with_the_grant(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"], webhook_queues=["work", "triage"])
    webhook = await _webhook(agent)
    wid = webhook["webhook_id"]

    empty = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert empty["rules"] == [] and empty["default_action"] is None and empty["params"] is None
    assert empty["effective_default_action"] == {"queue": "work"}
    assert empty["grant"] == {
        "queues": ["work", "triage"],
        "endpoints": [{"endpoint_id": agent.endpoint_id, "scope_queues": ["work"], "owner": True}],
    }

    saved = await agent.ok(
        "set_webhook_rules",
        {
            "webhook_id": wid,
            "rules": [
                {"name": "bugs", "expr": '.issue.labels | index("bug") != null', "action": {"queue": "triage"}},
                {"id": "noise", "expr": '.kind == "ping"', "action": {"drop": True}},
            ],
            "default_action": {"queue": "work"},
            "params": {"trusted": ["joestump"]},
        },
    )
    minted = saved["rules"][0]["id"]
    assert minted.startswith("r_") and saved["rules"][1]["id"] == "noise"
    assert saved["rules"][0]["name"] == "bugs"
    assert saved["default_action"] == {"queue": "work"} and saved["params"] == {"trusted": ["joestump"]}
    assert saved["grant"]["queues"] == ["work", "triage"]
    listed = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert {k: listed[k] for k in ("rules", "default_action", "params", "grant")} == {
        k: saved[k] for k in ("rules", "default_action", "params", "grant")
    }
    assert _stored_rules(stack, wid) == (saved["rules"], {"queue": "work"}, {"trusted": ["joestump"]})

    # set replaces rules, default and params together: omitting params clears them.
    cleared = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [MATCH_ALL]})
    assert cleared["rules"] == [MATCH_ALL] and cleared["default_action"] is None and cleared["params"] is None
    assert _stored_rules(stack, wid) == ([MATCH_ALL], None, None)

    # The webhook list counts the rules.
    [listed_webhook] = (await agent.ok("list_webhooks", {}))["webhooks"]
    assert listed_webhook["rule_count"] == 1


async def test_single_rule_mutations_keep_params_and_default(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"], webhook_queues=["work", "triage"])
    wid = (await _webhook(agent))["webhook_id"]
    await agent.ok(
        "set_webhook_rules",
        {
            "webhook_id": wid,
            "rules": [{"id": "a", "expr": "false", "action": {"queue": "work"}}],
            "default_action": {"queue": "triage"},
            "params": {"k": 1},
        },
    )
    added = await agent.ok(
        "add_webhook_rule", {"webhook_id": wid, "rule": {"expr": ".size > 10", "action": {"drop": True}}}
    )
    new_id = added["rule_id"]
    assert [r["id"] for r in added["rules"]] == ["a", new_id] and new_id.startswith("r_")
    front = await agent.ok(
        "add_webhook_rule",
        {
            "webhook_id": wid,
            "position": 0,
            "rule": {"id": "z", "name": "first", "expr": "true", "action": {"queue": "triage"}},
        },
    )
    assert front["rule_id"] == "z" and [r["id"] for r in front["rules"]] == ["z", "a", new_id]
    past = await agent.call(
        "add_webhook_rule", {"webhook_id": wid, "position": 9, "rule": {"expr": "true", "action": {"drop": True}}}
    )
    assert past.status_code == 422 and past.json()["error"]["code"] == "invalid_argument"

    updated = await agent.ok(
        "update_webhook_rule", {"webhook_id": wid, "rule_id": "z", "rule": {"name": None, "expr": ".verified"}}
    )
    assert updated["rules"][0] == {"id": "z", "expr": ".verified", "action": {"queue": "triage"}}
    renamed = await agent.ok("update_webhook_rule", {"webhook_id": wid, "rule_id": "z", "rule": {"id": "zz"}})
    assert renamed["rules"][0]["id"] == "zz"

    moved = await agent.ok("move_webhook_rule", {"webhook_id": wid, "rule_id": "zz", "position": 2})
    assert [r["id"] for r in moved["rules"]] == ["a", new_id, "zz"]
    out_of_range = await agent.call("move_webhook_rule", {"webhook_id": wid, "rule_id": "zz", "position": 3})
    assert out_of_range.status_code == 422 and out_of_range.json()["error"]["code"] == "invalid_argument"

    for verb_name, extra in (
        ("update_webhook_rule", {"rule": {"expr": "true"}}),
        ("move_webhook_rule", {"position": 0}),
    ):
        missing = await agent.call(verb_name, {"webhook_id": wid, "rule_id": "nope", **extra})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "rule_not_found"

    removed = await agent.ok("remove_webhook_rule", {"webhook_id": wid, "rule_id": new_id})
    assert removed["removed"] is True and [r["id"] for r in removed["rules"]] == ["a", "zz"]
    again = await agent.ok("remove_webhook_rule", {"webhook_id": wid, "rule_id": new_id})
    assert again["removed"] is False and again["rules"] == removed["rules"]

    for result in (added, front, updated, renamed, moved, removed, again):
        assert result["params"] == {"k": 1} and result["default_action"] == {"queue": "triage"}
        assert result["grant"]["endpoints"][0]["endpoint_id"] == agent.endpoint_id


async def test_validation_codes_name_the_rule_and_leave_the_previous_list(stack: Stack) -> None:
    human = await stack.human()
    agent = await stack.agent(human, queues=["work"], webhook_queues=["work", "lane-m"])
    sibling = await stack.agent(human, queues=["lane-m"])  # same human, not routed
    wid = (await _webhook(agent))["webhook_id"]
    good = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [MATCH_ALL], "params": {"p": 1}})

    async def rejected(body: dict[str, Any], status: int, code: str, *names: str) -> None:
        resp = await agent.call("set_webhook_rules", {"webhook_id": wid, **body})
        assert resp.status_code == status, resp.text
        assert resp.json()["error"]["code"] == code
        for name in names:
            assert name in resp.json()["error"]["message"]
        listed = await agent.ok("list_webhook_rules", {"webhook_id": wid})
        assert listed["rules"] == good["rules"] and listed["params"] == {"p": 1}

    typo = {"id": "typo", "name": "the typo", "expr": ".issue.labels | map(.name", "action": {"queue": "work"}}
    await rejected({"rules": [MATCH_ALL, typo]}, 422, "invalid_expression", "rule index 1", '"typo"', '"the typo"')
    await rejected(
        {"rules": [{"id": "envy", "expr": "env.HOME != null", "action": {"drop": True}}]},
        422,
        "forbidden_function",
        "rule index 0",
        '"envy"',
    )
    await rejected(
        {"rules": [{"id": "d", "expr": "true", "action": {"drop": True, "endpoints": [agent.endpoint_id]}}]},
        422,
        "invalid_rule",
        '"d"',
    )
    many = [{"id": f"r{i}", "expr": "false", "action": {"drop": True}} for i in range(33)]
    await rejected({"rules": many}, 422, "too_many_rules", "rule index 32")
    await rejected({"rules": [MATCH_ALL], "params": {"blob": "x" * 17000}}, 422, "invalid_params")
    await rejected({"rules": [{"id": "q", "expr": "true", "action": {"queue": "secret"}}]}, 403, "forbidden", '"q"')
    # A rule cannot add a delivery target, not even the owner's own unrouted endpoint.
    own = {"id": "own", "expr": "true", "action": {"queue": "lane-m", "endpoints": [sibling.endpoint_id]}}
    await rejected({"rules": [own]}, 403, "forbidden", "rule index 0", '"own"')
    # An exclusive action needs a candidate scoped to its queue (the owner is scoped to work only).
    lane = {"id": "lane", "expr": "true", "action": {"queue": "lane-m", "exclusive": True}}
    await rejected({"rules": [lane]}, 403, "forbidden", '"lane"')
    await rejected({"rules": [MATCH_ALL], "default_action": {"queue": "elsewhere"}}, 403, "forbidden", "default_action")

    # The same codes through the single-rule verbs.
    add = await agent.call("add_webhook_rule", {"webhook_id": wid, "rule": typo})
    assert add.status_code == 422 and add.json()["error"]["code"] == "invalid_expression"
    upd = await agent.call(
        "update_webhook_rule", {"webhook_id": wid, "rule_id": "all", "rule": {"action": {"queue": "nope"}}}
    )
    assert upd.status_code == 403 and upd.json()["error"]["code"] == "forbidden"

    # Once routed, the sibling is a target and the same rules save.
    _routed_endpoint(stack, wid, sibling.endpoint_id)
    ok = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [own, lane]})
    assert [e["endpoint_id"] for e in ok["grant"]["endpoints"]] == [agent.endpoint_id, sibling.endpoint_id]


async def test_another_humans_webhook_is_opaque_to_every_rule_verb(stack: Stack) -> None:
    owner = await stack.agent()
    stranger = await stack.agent()  # another human, every verb allowed
    wid = (await _webhook(owner))["webhook_id"]
    await owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [MATCH_ALL], "params": {"secret": "s"}})
    before = _stored_rules(stack, wid)
    bodies: dict[str, dict[str, Any]] = {
        "list_webhook_rules": {},
        "set_webhook_rules": {"rules": []},
        "add_webhook_rule": {"rule": {"expr": "true", "action": {"drop": True}}},
        "update_webhook_rule": {"rule_id": "all", "rule": {"expr": "false"}},
        "move_webhook_rule": {"rule_id": "all", "position": 0},
        "remove_webhook_rule": {"rule_id": "all"},
        "test_webhook_rules": {"payload": {}},
        "backtest_webhook_rules": {},
    }
    assert set(bodies) == set(RULE_VERBS)
    for name, body in bodies.items():
        answers = []
        for webhook_id in (wid, "wh_" + "0" * 24, "not a webhook id ' --"):
            resp = await stranger.call(name, {"webhook_id": webhook_id, **body})
            answers.append((resp.status_code, resp.json()))
        assert (
            answers[0]
            == answers[1]
            == answers[2]
            == (404, {"error": {"code": "not_found", "message": "unknown webhook"}})
        ), name
    assert _stored_rules(stack, wid) == before


async def test_rule_verbs_outside_the_allowlist_are_forbidden_and_change_nothing(stack: Stack) -> None:
    human = await stack.human()
    owner = await stack.agent(human)
    wid = (await _webhook(owner))["webhook_id"]
    await owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [MATCH_ALL]})
    limited = await stack.agent(human, verbs=["list_webhooks", "list_webhook_rules"])
    listed = await limited.ok("list_webhook_rules", {"webhook_id": wid})
    assert listed["rules"] == [MATCH_ALL]
    for name in RULE_VERBS:
        if name == "list_webhook_rules":
            continue
        resp = await limited.call(name, {"webhook_id": wid, "rules": [], "rule_id": "all"})
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden", name
    assert _stored_rules(stack, wid)[0] == [MATCH_ALL]


async def test_rule_verbs_are_in_the_webhooks_family(stack: Stack) -> None:
    spec = (await stack.http.get("/openapi.json")).json()
    for name in RULE_VERBS:
        [operation] = spec["paths"][f"/v1/{name}"].values()
        assert operation["tags"] == ["webhooks"], name


async def test_dry_run_on_a_sample_uses_candidates_without_saving_them(stack: Stack) -> None:
    human = await stack.human()
    agent = await stack.agent(human, queues=["work"], webhook_queues=["work", "lane-m"])
    lane_a = await stack.agent(human, queues=["lane-m"])
    lane_b = await stack.agent(human, queues=["lane-m"])
    webhook = await _webhook(agent)
    wid = webhook["webhook_id"]
    _routed_endpoint(stack, wid, lane_a.endpoint_id)
    _routed_endpoint(stack, wid, lane_b.endpoint_id)
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [MATCH_ALL]})

    sample = issue_payload(number=12)
    headers = {"X-GitHub-Event": "issues", "X-Hub-Signature-256": "sha256=abc"}
    saved = await agent.ok("test_webhook_rules", {"webhook_id": wid, "payload": sample, "headers": headers})
    assert saved["candidate"] is False
    assert saved["decision"] == {
        "disposition": "routed",
        "drop": False,
        "queue": "work",
        "endpoints": [agent.endpoint_id, lane_a.endpoint_id, lane_b.endpoint_id],
        "once_key": None,
        "work_order": None,
    }
    assert saved["trace"] == {"stage": "rule", "rule_index": 0, "rule_id": "all", "action": {"queue": "work"}}
    env = saved["envelope"]
    assert env["source"] == "github" and env["kind"] == "issues" and env["verified"] is True
    assert env["webhook_id"] == wid and env["trust_mode"] == "signed"
    assert env["issue"]["key"] == "github:acme/app#12" and env["payload"] == sample
    assert env["headers"]["x-hub-signature-256"] == "«redacted»"

    lane_rule = {
        "id": "lane-m",
        "name": "medium",
        "expr": ".issue != null",
        "action": {"queue": "lane-m", "exclusive": True, "once": True, "work_order": True},
    }
    tried = await agent.ok(
        "test_webhook_rules",
        {"webhook_id": wid, "payload": sample, "headers": headers, "rules": [lane_rule], "omit_envelope": True},
    )
    assert tried["candidate"] is True and tried["envelope"] is None
    decision = tried["decision"]
    assert decision["queue"] == "lane-m" and decision["endpoints"] == [lane_a.endpoint_id]
    assert decision["once_key"] and decision["once_key"].startswith("once:")
    assert tried["trace"]["once_key"] == decision["once_key"]
    order = decision["work_order"]
    assert order["lane"] == "lane-m" and order["authorized_by"] == {
        "stage": "rule",
        "rule_id": "lane-m",
        "rule_name": "medium",
    }
    assert order["subject"]["number"] == 12 and order["verified"] is True

    dropped = await agent.ok(
        "test_webhook_rules",
        {"webhook_id": wid, "payload": {"zen": "hi"}, "rules": [], "default_action": {"drop": True}},
    )
    assert dropped["decision"]["disposition"] == "dropped" and dropped["decision"]["drop"] is True
    assert dropped["trace"] == {"stage": "default", "cause": "no_match_default", "action": {"drop": True}}

    bad = await agent.call(
        "test_webhook_rules", {"webhook_id": wid, "payload": {}, "rules": [{"expr": "input", "action": {"drop": True}}]}
    )
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "forbidden_function"
    not_granted = await agent.call(
        "test_webhook_rules", {"webhook_id": wid, "payload": {}, "rules": [{"expr": "true", "action": {"queue": "x"}}]}
    )
    assert not_granted.status_code == 403 and not_granted.json()["error"]["code"] == "forbidden"

    listed = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert listed["rules"] == [MATCH_ALL]
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 0
    assert stack.sql("SELECT count(*) FROM routing_once")[0][0] == 0


async def test_dry_run_input_must_be_exactly_one_of_payload_or_event(stack: Stack) -> None:
    agent = await stack.agent()
    wid = (await _webhook(agent))["webhook_id"]
    for body in ({}, {"payload": {}, "event_id": "ev_x"}, {"headers": {"a": "b"}, "event_id": "ev_x"}):
        resp = await agent.call("test_webhook_rules", {"webhook_id": wid, **body})
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "invalid_argument", body
    # A JSON null is a sample payload too.
    ok = await agent.ok("test_webhook_rules", {"webhook_id": wid, "payload": None})
    assert ok["envelope"]["payload"] is None and ok["decision"]["queue"] == "work"


async def test_dry_run_on_a_stored_event_and_other_webhooks_events_are_not_found(stack: Stack) -> None:
    agent = await stack.agent()
    stranger = await stack.agent()
    webhook = await _webhook(agent)
    other_own = await _webhook(agent)
    foreign = await _webhook(stranger)
    wid = webhook["webhook_id"]
    mine = (await post_github(stack.http, webhook, issue_payload(number=3), delivery="d-3")).json()
    sibling = (await post_github(stack.http, other_own, issue_payload(number=4))).json()
    theirs = (await post_github(stack.http, foreign, issue_payload(number=5))).json()

    tried = await agent.ok(
        "test_webhook_rules",
        {
            "webhook_id": wid,
            "event_id": mine["event_id"],
            "rules": [{"id": "drop3", "expr": ".issue.number == 3", "action": {"drop": True}}],
        },
    )
    assert tried["event_id"] == mine["event_id"] and tried["decision"]["drop"] is True
    assert tried["trace"]["rule_id"] == "drop3"
    assert tried["envelope"]["verified"] is True and tried["envelope"]["issue"]["number"] == 3
    assert (await agent.ok("list_webhook_rules", {"webhook_id": wid}))["rules"] == []
    [(disposition,)] = stack.sql("SELECT disposition FROM events WHERE id = %s", mine["event_id"])
    assert disposition == "routed"

    for event_id in (theirs["event_id"], sibling["event_id"], "ev_unknown"):
        resp = await agent.call("test_webhook_rules", {"webhook_id": wid, "event_id": event_id})
        assert resp.status_code == 404 and resp.json() == {"error": {"code": "not_found", "message": "unknown event"}}
        assert "acme" not in resp.text


async def test_backtest_reports_changed_decisions_and_persists_nothing(stack: Stack) -> None:
    human = await stack.human()
    agent = await stack.agent(human, queues=["work"], webhook_queues=["work", "lane-m"])
    lane = await stack.agent(human, queues=["lane-m"])
    webhook = await _webhook(agent)
    wid = webhook["webhook_id"]
    _routed_endpoint(stack, wid, lane.endpoint_id)
    await agent.ok(
        "set_webhook_rules",
        {"webhook_id": wid, "rules": [{"id": "noise", "expr": '.issue.title == "noise"', "action": {"drop": True}}]},
    )
    posted = []
    for n, title in enumerate(["real bug", "noise", "real bug", "other"], start=1):
        resp = await post_github(stack.http, webhook, issue_payload(number=n, title=title), delivery=f"bt-{n}")
        assert resp.status_code == 202
        posted.append(resp.json())
    # Same issue again (relabel): under a once rule it is a repeat.
    again = await post_github(stack.http, webhook, issue_payload(number=1, title="real bug", action="labeled"))
    posted.append(again.json())
    before = stack.sql("SELECT count(*) FROM events")[0][0], stack.sql("SELECT count(*) FROM todos")[0][0]
    saved_rules = _stored_rules(stack, wid)

    same = await agent.ok("backtest_webhook_rules", {"webhook_id": wid})
    assert same["candidate"] is False and same["summary"]["events"] == 5 and same["summary"]["changed"] == 0
    assert same["summary"]["stored_by_decision"] == {"routed": 4, "dropped": 1}

    candidate = {
        "webhook_id": wid,
        "rules": [
            {"id": "keep-noise", "expr": '.issue.title == "noise"', "action": {"queue": "work"}},
            {
                "id": "bugs",
                "expr": '.issue.title == "real bug"',
                "action": {"queue": "lane-m", "exclusive": True, "once": True},
            },
            {"id": "boom", "expr": ".issue.title | error", "action": {"drop": True}},
        ],
        "default_action": {"drop": True},
        "limit": 10,
    }
    report = await agent.ok("backtest_webhook_rules", candidate)
    assert report["candidate"] is True
    rows = {r["event_id"]: r for r in report["events"]}
    assert [r["event_id"] for r in report["events"]] == [p["event_id"] for p in reversed(posted)]

    bug1, noise, bug3, other, relabel = (rows[p["event_id"]] for p in posted)
    assert bug1["stored"]["disposition"] == "routed" and bug1["stored"]["endpoints"] == [
        agent.endpoint_id,
        lane.endpoint_id,
    ]
    assert bug1["stored"]["queue"] == "work" and bug1["stored"]["stage"] == "default"
    assert bug1["candidate"]["disposition"] == "routed" and bug1["candidate"]["endpoints"] == [lane.endpoint_id]
    assert bug1["candidate"]["queue"] == "lane-m" and bug1["candidate"]["rule_id"] == "bugs"
    assert bug1["candidate"]["once_key"] and bug1["changed"] is True
    assert noise["stored"]["disposition"] == "dropped" and noise["stored"]["rule_id"] == "noise"
    assert noise["candidate"]["disposition"] == "routed" and noise["candidate"]["rule_id"] == "keep-noise"
    assert (
        bug3["candidate"]["disposition"] == "routed" and bug3["candidate"]["once_key"] != bug1["candidate"]["once_key"]
    )
    assert other["candidate"]["disposition"] == "dropped" and other["candidate"]["cause"] == "no_match_default"
    assert [f["cause"] for f in other["candidate"]["faults"]] == ["error"]
    assert relabel["candidate"]["disposition"] == "repeat" and relabel["candidate"]["endpoints"] == []
    assert relabel["received_at"] and relabel["kind"] == "issues"

    summary = report["summary"]
    assert summary["events"] == 5 and summary["changed"] == 5
    assert summary["by_decision"] == {"routed": 3, "dropped": 1, "repeat": 1}
    assert summary["by_rule"] == {"bugs": 3, "keep-noise": 1, "default:no_match_default": 1}
    assert summary["faulted"] == 1
    assert summary["transitions"] == {"routed→routed": 2, "dropped→routed": 1, "routed→dropped": 1, "routed→repeat": 1}

    limited = await agent.ok("backtest_webhook_rules", {"webhook_id": wid, "limit": 2})
    assert [r["event_id"] for r in limited["events"]] == [posted[4]["event_id"], posted[3]["event_id"]]
    too_many = await agent.call("backtest_webhook_rules", {"webhook_id": wid, "limit": 201})
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "invalid_argument"
    invalid = await agent.call(
        "backtest_webhook_rules", {"webhook_id": wid, "rules": [{"expr": "now", "action": {"drop": True}}]}
    )
    assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "forbidden_function"

    after = stack.sql("SELECT count(*) FROM events")[0][0], stack.sql("SELECT count(*) FROM todos")[0][0]
    assert after == before and _stored_rules(stack, wid) == saved_rules
    assert stack.sql("SELECT count(*) FROM routing_once")[0][0] == 0


def test_pack_install_body_from_shipped_packs_and_params() -> None:
    from cli.main import build_parser
    from cli.packs import load_pack

    fleet = load_pack("fleet")
    shipped = json.loads((Path(__file__).resolve().parents[2] / "docs/routing/rule-packs/fleet.json").read_text())
    assert fleet == {
        "rules": shipped["rules"],
        "default_action": {"drop": True},
        "on_fault": "hold",
        "params": shipped["params"],
    }
    pool = load_pack("pool-review", params=["identity=joestump-agent"])
    assert "default_action" not in pool and pool["params"] == {"identity": "joestump-agent"}
    assert pool["on_fault"] == "hold"
    with_list = load_pack("pool-review", params=['identity=["a"]'])
    assert with_list["params"] == {"identity": ["a"]}
    args = build_parser().parse_args(
        ["rules", "install", "--webhook", "wh_1", "--pack", "fleet", "--param", "require_verified=false"]
    )
    assert args.webhook_id == "wh_1" and args.pack == "fleet" and args.param == ["require_verified=false"]


async def test_pool_review_pack_installs_with_one_call(stack: Stack, tmp_path: Path) -> None:
    from cli.packs import load_pack

    agent = await stack.agent()
    webhook = await _webhook(agent)
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({"identity": "joestump-agent"}))
    installed = await agent.ok(
        "set_webhook_rules", {"webhook_id": webhook["webhook_id"], **load_pack("pool-review", str(params_file))}
    )
    assert [r["id"] for r in installed["rules"]] == ["review-request-not-for-me", "own-pr-review-trigger"]
    assert installed["params"] == {"identity": "joestump-agent"} and installed["default_action"] is None
    assert installed["on_fault"] == "hold"

    review = {
        "action": "review_requested",
        "requested_reviewer": {"login": "joestump"},
        "pull_request": {"number": 8, "user": {"login": "joestump"}},
        "repository": {"full_name": "acme/app"},
        "sender": {"login": "joestump"},
    }
    resp = await post_github(stack.http, webhook, review, event="pull_request")
    assert resp.status_code == 202 and resp.json()["dropped"] is True
    review["requested_reviewer"] = {"login": "joestump-agent"}
    resp = await post_github(stack.http, webhook, review, event="pull_request")
    assert resp.status_code == 202 and resp.json()["created"] == 1


async def test_dry_run_envelopes_read_gitea_and_github_label_events_alike(stack: Stack) -> None:
    agent = await stack.agent()
    gitea = (await _webhook(agent, "gitea"))["webhook_id"]
    github = (await _webhook(agent, "github"))["webhook_id"]
    issue = issue_payload(number=4, action="label_updated")
    issue["issue"]["labels"] = [{"name": "size/M"}]
    issue["sender"] = {"login": "labeler"}
    via_gitea = await agent.ok(
        "test_webhook_rules",
        {
            "webhook_id": gitea,
            "payload": issue,
            "headers": {"X-Gitea-Event": "issues", "X-Gitea-Event-Type": "issue_label"},
        },
    )
    labeled = {**issue, "action": "labeled", "label": {"name": "size/M"}}
    via_github = await agent.ok(
        "test_webhook_rules", {"webhook_id": github, "payload": labeled, "headers": {"X-GitHub-Event": "issues"}}
    )
    for env in (via_gitea["envelope"], via_github["envelope"]):
        assert env["issue"]["label_event"] is True and env["issue"]["labels"] == ["size/M"]
        assert env["issue"]["sender"] == "labeler"
    pull = {"action": "label_updated", "pull_request": {"number": 2}, "repository": {"full_name": "acme/app"}}
    as_pr = await agent.ok(
        "test_webhook_rules", {"webhook_id": gitea, "payload": pull, "headers": {"X-Gitea-Event": "pull_request"}}
    )
    assert as_pr["envelope"]["issue"] is None


async def test_concurrent_mutations_serialize_on_the_row_lock(stack: Stack) -> None:
    import asyncio

    agent = await stack.agent()
    wid = (await _webhook(agent))["webhook_id"]
    results = await asyncio.gather(
        *(
            agent.call(
                "add_webhook_rule",
                {"webhook_id": wid, "rule": {"id": f"c{i}", "expr": "false", "action": {"drop": True}}},
            )
            for i in range(12)
        )
    )
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    listed = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert sorted(r["id"] for r in listed["rules"]) == sorted(f"c{i}" for i in range(12))
