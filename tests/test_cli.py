"""The operator commands come from the verb table: one command per admin verb, building that verb's input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cli.main
from api.verbs import ADMIN_VERBS, REGISTRY
from cli.client import CliError, admin_token, api_url
from cli.output import cell, mode, render, table
from cli.tail import Tail
from routing.sources import SOURCE_TYPES
from switchboard.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, dict[str, Any]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def admin(settings: Settings, args: Any, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append((verb, body))
        return {}

    monkeypatch.setattr(cli.main, "_admin", admin)
    args = cli.main.build_parser().parse_args(list(argv))
    assert args.fn(Settings(), args) == 0
    [(verb, body)] = sent
    ADMIN_VERBS[verb].input.model_validate(body)  # what the command sends is the verb's input
    return verb, body


def test_operator_commands_send_their_verbs_input(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(monkeypatch, "human", "create", "--name", "joe") == ("create_human", {"name": "joe"})
    assert run(monkeypatch, "agent", "create", "--human", "hu_1", "--name", "bot") == (
        "create_agent",
        {"human_id": "hu_1", "name": "bot"},
    )
    assert run(monkeypatch, "endpoint", "vend", "--agent", "ag_1", "--queues", "a, b") == (
        "vend_endpoint",
        {
            "agent_id": "ag_1",
            "queues": ["a", "b"],
            "verbs": list(REGISTRY),
            "webhook_max": 5,
            "webhook_source_types": list(SOURCE_TYPES),
            "webhook_queues": ["a", "b"],
        },
    )
    _, narrow = run(
        monkeypatch,
        *("endpoint", "vend", "--agent", "ag_1", "--queues", "a", "--verbs", "claim,complete"),
        *("--webhook-max", "0", "--webhook-source-types", "stripe", "--webhook-queues", "x,y"),
    )
    assert narrow["verbs"] == ["claim", "complete"] and narrow["webhook_max"] == 0
    assert narrow["webhook_source_types"] == ["stripe"] and narrow["webhook_queues"] == ["x", "y"]
    assert run(monkeypatch, "endpoint", "revoke", "en_1") == ("revoke_endpoint", {"endpoint_id": "en_1"})
    assert run(monkeypatch, "friend", "set", "hu_a", "hu_b") == (
        "set_friend_edge",
        {"from_human_id": "hu_a", "to_human_id": "hu_b", "state": "approved"},
    )
    assert run(monkeypatch, "friend", "set", "hu_a", "hu_b", "--state", "revoked")[1]["state"] == "revoked"
    assert run(monkeypatch, "webhook", "rate", "wh_1", "2.5") == (
        "set_webhook_rate",
        {"webhook_id": "wh_1", "rate_per_second": 2.5},
    )
    assert run(monkeypatch, "webhook", "rate", "wh_1", "default")[1]["rate_per_second"] is None


def test_every_admin_verb_has_a_command_and_the_readme_names_both() -> None:
    for name, verb in ADMIN_VERBS.items():
        assert verb.cli is not None, name
        assert f"`{name}`" in README, name
        assert f"{verb.cli.group} {verb.cli.action}" in README, name


def run_agent(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, dict[str, Any]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def agent(settings: Settings, args: Any, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append((verb, body))
        return {}

    monkeypatch.setattr(cli.main, "_agent", agent)
    args = cli.main.build_parser().parse_args([*argv, "--credential", "sbk_x"])
    assert args.fn(Settings(), args) == 0
    [(verb, body)] = sent
    REGISTRY[verb].input.model_validate(body)  # what the command sends is the verb's input
    return verb, body


def test_agent_commands_from_the_verb_table_send_their_verbs_input(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_agent(monkeypatch, "todos", "retry", "td_1") == ("retry_todo", {"todo_id": "td_1"})
    assert run_agent(monkeypatch, "todos", "cancel", "td_1") == ("cancel_todo", {"todo_id": "td_1"})
    assert run_agent(monkeypatch, "todos", "cancel", "td_1", "--reason", "dup") == (
        "cancel_todo",
        {"todo_id": "td_1", "reason": "dup"},
    )
    assert run_agent(monkeypatch, "events", "get-reroute", "reroute-batch-wh_1") == (
        "get_reroute",
        {"workflow_id": "reroute-batch-wh_1"},
    )
    assert run_agent(monkeypatch, "rules", "compile", "wh_1", "bugs to triage", "--sample", "5") == (
        "compile_webhook_rule",
        {"webhook_id": "wh_1", "sentence": "bugs to triage", "sample": 5},
    )
    # The composed command picks one of the two re-route verbs.
    assert run_agent(monkeypatch, "events", "reroute", "ev_1", "--dry-run") == (
        "reroute_webhook_event",
        {"event_id": "ev_1", "dry_run": True},
    )
    assert run_agent(monkeypatch, "events", "reroute", "--webhook", "wh_1", "--disposition", "dropped") == (
        "reroute_webhook_events",
        {"webhook_id": "wh_1", "dry_run": False, "disposition": "dropped"},
    )


def test_trust_gate_and_quarantine_commands_send_their_verbs_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_agent(monkeypatch, "webhooks", "trust", "wh_1", "--logins", "Alice, bob", "--match", "author") == (
        "set_webhook_trusted_actors",
        {"webhook_id": "wh_1", "trusted_actors": {"logins": ["Alice", "bob"], "match": "author"}},
    )
    assert run_agent(monkeypatch, "webhooks", "trust", "wh_1", "--logins", "") == (
        "set_webhook_trusted_actors",
        {"webhook_id": "wh_1", "trusted_actors": {"logins": [], "match": "both"}},
    )
    assert run_agent(monkeypatch, "webhooks", "trust", "wh_1", "--actor-ids", "joe@example.com") == (
        "set_webhook_trusted_actors",
        {"webhook_id": "wh_1", "trusted_actors": {"actor_ids": ["joe@example.com"]}},
    )
    assert run_agent(monkeypatch, "webhooks", "trust", "wh_1", "--allow-all")[1]["trusted_actors"] == {
        "allow_all": True
    }
    assert run_agent(monkeypatch, "webhooks", "trust", "wh_1", "--clear")[1] == {
        "webhook_id": "wh_1",
        "trusted_actors": None,
    }
    assert run_agent(monkeypatch, "events", "release", "ev_1", "--note", "ok") == (
        "release_webhook_event",
        {"event_id": "ev_1", "note": "ok"},
    )
    assert run_agent(monkeypatch, "events", "dismiss", "ev_1") == ("dismiss_webhook_event", {"event_id": "ev_1"})
    assert run_agent(monkeypatch, "events", "list", "--disposition", "quarantined", "--quarantine-state", "held") == (
        "list_webhook_events",
        {"disposition": "quarantined", "quarantine_state": "held"},
    )
    rules = tmp_path / "rules.json"
    rules.write_text('{"rules": [], "default_action": {"quarantine": true}}')
    assert run_agent(monkeypatch, "rules", "set", "wh_1", "--file", str(rules), "--force") == (
        "set_webhook_rules",
        {"webhook_id": "wh_1", "rules": [], "default_action": {"quarantine": True}, "force": True},
    )
    assert (
        run_agent(monkeypatch, "rules", "install", "--webhook", "wh_1", "--pack", str(rules), "--force")[1]["force"]
        is True
    )


def test_every_agent_command_is_in_the_readme() -> None:
    commands = {name: verb.cli for name, verb in REGISTRY.items() if verb.cli is not None}
    assert set(commands) >= {"retry_todo", "cancel_todo", "get_reroute"}
    for name, command in commands.items():
        assert f"`{name}`" in README, name
        assert f"switchboard {command.group} {command.action}" in README, name


def test_owner_commands_from_the_verb_table_send_their_verbs_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert run_agent(monkeypatch, "webhooks", "list") == ("list_webhooks", {})
    assert run_agent(monkeypatch, "schedules", "list") == ("list_schedules", {})
    assert run_agent(monkeypatch, "events", "list") == ("list_webhook_events", {})
    assert run_agent(
        monkeypatch, "events", "list", "--webhook", "wh_1", "--disposition", "dropped", "--limit", "5"
    ) == ("list_webhook_events", {"webhook_id": "wh_1", "disposition": "dropped", "limit": 5})
    assert run_agent(monkeypatch, "events", "show", "ev_1") == ("get_webhook_event", {"event_id": "ev_1"})
    assert run_agent(monkeypatch, "todos", "list", "--state", "pending", "--queue", "work") == (
        "list_todos",
        {"queue": "work", "state": "pending"},
    )
    assert run_agent(monkeypatch, "todos", "get", "td_1") == ("get_todo", {"todo_id": "td_1"})
    assert run_agent(monkeypatch, "rules", "list", "wh_1") == ("list_webhook_rules", {"webhook_id": "wh_1"})
    rule = {"id": "r", "expr": "true", "action": {"queue": "work"}}
    (tmp_path / "rules.json").write_text(json.dumps({"rules": [rule], "on_fault": "hold"}))
    (tmp_path / "bare.json").write_text(json.dumps([rule]))
    (tmp_path / "sample.json").write_text('{"action": "opened"}')
    assert run_agent(monkeypatch, "rules", "set", "wh_1", "--file", str(tmp_path / "rules.json")) == (
        "set_webhook_rules",
        {"webhook_id": "wh_1", "rules": [rule], "on_fault": "hold"},
    )
    assert run_agent(monkeypatch, "rules", "set", "wh_1", "--file", str(tmp_path / "bare.json"))[1] == {
        "webhook_id": "wh_1",
        "rules": [rule],
    }
    assert run_agent(monkeypatch, "rules", "test", "wh_1", "--payload", str(tmp_path / "sample.json")) == (
        "test_webhook_rules",
        {"webhook_id": "wh_1", "payload": {"action": "opened"}},
    )
    assert run_agent(
        monkeypatch,
        "rules",
        "test",
        "wh_1",
        "--event",
        "ev_1",
        "--rules",
        str(tmp_path / "bare.json"),
        "--omit-envelope",
    ) == ("test_webhook_rules", {"webhook_id": "wh_1", "event_id": "ev_1", "rules": [rule], "omit_envelope": True})
    assert run_agent(monkeypatch, "rules", "backtest", "wh_1", "--limit", "20") == (
        "backtest_webhook_rules",
        {"webhook_id": "wh_1", "limit": 20},
    )


def test_operator_list_commands_send_their_verbs_input(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(monkeypatch, "human", "list") == ("list_humans", {"limit": 50, "cursor": None})
    assert run(monkeypatch, "agent", "list", "--human", "hu_1", "--limit", "2") == (
        "list_agents",
        {"human_id": "hu_1", "limit": 2, "cursor": None},
    )
    assert run(monkeypatch, "endpoint", "list", "--state", "revoked", "--cursor", "c") == (
        "list_endpoints",
        {"agent_id": None, "human_id": None, "state": "revoked", "limit": 50, "cursor": "c"},
    )


def test_global_options_go_before_or_after_the_command() -> None:
    parser = cli.main.build_parser()
    before = parser.parse_args(["--json", "--token", "sbk_a", "--url", "http://h:1", "todos", "list"])
    after = parser.parse_args(["todos", "list", "--json", "--token", "sbk_a", "--url", "http://h:1"])
    for args in (before, after):
        assert (args.output, args.token, args.url, args.admin_token) == ("json", "sbk_a", "http://h:1", None)
    assert parser.parse_args(["todos", "list", "--credential", "sbk_b"]).token == "sbk_b"  # the older name
    assert parser.parse_args(["human", "list"]).output is None


def test_the_api_url_is_the_bind_address_never_the_public_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SWITCHBOARD_URL", raising=False)
    public = "https://hooks.example.com"
    assert api_url(Settings(public_url=public), None) == "http://127.0.0.1:8000"
    assert api_url(Settings(public_url=public, http_host="0.0.0.0", http_port=9000), None) == "http://127.0.0.1:9000"
    assert api_url(Settings(http_host="::"), None) == "http://[::1]:8000"
    assert api_url(Settings(http_host="10.0.0.5"), None) == "http://10.0.0.5:8000"
    assert api_url(Settings(), "http://api:8000/") == "http://api:8000"
    monkeypatch.setenv("SWITCHBOARD_URL", "http://from-env:1")
    assert api_url(Settings(public_url=public), None) == "http://from-env:1"
    with pytest.raises(CliError) as bad:
        api_url(Settings(), "api:8000")
    assert bad.value.code == "invalid_url"


def test_the_admin_token_is_read_never_generated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SWITCHBOARD_ADMIN_TOKEN", raising=False)
    home = tmp_path / "home"
    with pytest.raises(CliError) as missing:
        admin_token(Settings(home=home), None)
    assert missing.value.code == "missing_admin_token" and not home.exists()
    home.mkdir()
    (home / "admin_token").write_text("sba_file\n")
    assert admin_token(Settings(home=home), None) == "sba_file"
    assert admin_token(Settings(home=home, admin_token="sba_env"), None) == "sba_env"
    assert admin_token(Settings(home=home, admin_token="sba_env"), "sba_flag") == "sba_flag"


def test_tables_and_key_value_lines() -> None:
    rows = {"todos": [{"id": "td_1", "state": "pending", "title": "a\nb", "created_at": "2026-12-01T16:05:01.5+00:00"}]}
    lines, hints = render({**rows, "next_cursor": "abc"}, ("id", "state", "title", "created_at"))
    assert lines == ["ID    STATE    TITLE  CREATED_AT", "td_1  pending  a b    2026-12-01 16:05:01"]
    assert hints == ["more: --cursor abc"]
    assert render({"todos": []}) == (["(no todos)"], [])
    # One object: its fields, nested values as JSON; a single wrapped object is unwrapped.
    lines, _ = render({"todo": {"id": "td_1", "routing": {"rule": "r"}, "update_event_ids": ["ev_1", "ev_2"]}})
    assert lines == ["id: td_1", 'routing: {"rule":"r"}', "update_event_ids: ev_1,ev_2"]
    # The rows' other fields follow the table.
    lines, _ = render({"webhooks": [{"webhook_id": "wh_1"}], "ceiling": {"max": 5, "used": 1}})
    assert lines == ["WEBHOOK_ID", "wh_1", "", 'ceiling: {"max":5,"used":1}']
    assert cell("x" * 100) == "x" * 100 and table([{"a": "x" * 100, "b": 1}])[1].startswith("x" * 59 + "…")


def test_output_is_a_table_on_a_terminal_and_json_into_a_pipe() -> None:
    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert mode(None, Stream(True)) == "table"  # type: ignore[arg-type]
    assert mode(None, Stream(False)) == "json"  # type: ignore[arg-type]
    assert mode("json", Stream(True)) == "json"  # type: ignore[arg-type]
    assert mode("table", Stream(False)) == "table"  # type: ignore[arg-type]


def test_tail_prints_only_what_is_new_once_including_late_commits_and_state_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    events: list[dict[str, Any]] = []
    todos: list[dict[str, Any]] = []

    def event(n: int, at: str) -> dict[str, Any]:
        return {"id": f"ev_{n}", "received_at": at, "source": "github", "kind": "issues", "disposition": "routed",
                "webhook_id": "wh_1", "todo_ids": []}  # fmt: skip

    def fake(verb: str, body: dict[str, Any]) -> dict[str, Any]:
        rows = events if verb == "list_webhook_events" else todos
        since = body.get("since")
        picked = sorted(
            (r for r in rows if since is None or r["received_at"] >= since),
            key=lambda r: r.get("received_at") or r["created_at"],
            reverse=True,
        )
        return {"events" if verb == "list_webhook_events" else "todos": picked[: body["limit"]]}

    tail = Tail(fake, "json", webhook_id=None, queue=None)
    events.append(event(1, "2026-12-01T10:00:00+00:00"))
    tail.poll(show=False)  # what was there before tail started is not printed
    events.append(event(2, "2026-12-01T10:00:05+00:00"))
    todos.append({"id": "td_1", "created_at": "2026-12-01T10:00:05+00:00", "queue": "work", "state": "pending",
                  "title": "t"})  # fmt: skip
    tail.poll(show=True)
    # A delivery received earlier than the newest shown commits late; a todo is claimed; nothing else changes.
    events.append(event(3, "2026-12-01T10:00:03+00:00"))
    todos[0] = {**todos[0], "state": "claimed"}
    tail.poll(show=True)
    tail.poll(show=True)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["type"], p["id"], p.get("previous_state")) for p in printed] == [
        ("event", "ev_2", None),
        ("todo", "td_1", None),
        ("event", "ev_3", None),
        ("todo", "td_1", "pending"),
    ]
