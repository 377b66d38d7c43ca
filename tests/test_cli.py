"""The operator commands come from the verb table: one command per admin verb, building that verb's input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import cli.main
from api.verbs import ADMIN_VERBS, REGISTRY
from routing.sources import SOURCE_TYPES
from switchboard.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, dict[str, Any]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def admin(settings: Settings, verb: str, body: dict[str, Any]) -> int:
        sent.append((verb, body))
        return 0

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

    def agent(settings: Settings, args: Any, verb: str, body: dict[str, Any]) -> tuple[int, None]:
        sent.append((verb, body))
        return 0, None

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
    assert run_agent(monkeypatch, "rules", "compile", "--webhook", "wh_1", "bugs to triage", "--sample", "5") == (
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


def test_every_agent_command_is_in_the_readme() -> None:
    commands = {name: verb.cli for name, verb in REGISTRY.items() if verb.cli is not None}
    assert set(commands) >= {"retry_todo", "cancel_todo", "get_reroute"}
    for name, command in commands.items():
        assert f"`{name}`" in README, name
        assert f"switchboard {command.group} {command.action}" in README, name
