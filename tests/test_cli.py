"""The operator commands come from the verb table: one command per admin verb, building that verb's input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

import cli.main
from api.verbs import ADMIN_VERBS, REGISTRY
from api.verbs.registry import ArgType, Completer
from cli import client, commands
from cli.client import CliError, admin_token, api_url
from cli.output import cell, mode, render, table
from cli.tail import Tail
from routing.sources import SOURCE_TYPES
from switchboard.settings import Settings

# The command line reference (the documentation site's page) names every command and its verb.
CLI_DOC = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()


def run(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, dict[str, Any]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def admin(args: Any, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append((verb, body))
        return {}

    monkeypatch.setattr(cli.main, "_admin", admin)
    args = cli.main.build_parser().parse_args(list(argv))
    assert args.fn(args) == 0
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


def test_every_admin_verb_has_a_command_and_the_cli_reference_names_both() -> None:
    for name, verb in ADMIN_VERBS.items():
        assert verb.cli is not None, name
        assert f"`{name}`" in CLI_DOC, name
        assert f"{verb.cli.group} {verb.cli.action}" in CLI_DOC, name


def run_agent(monkeypatch: pytest.MonkeyPatch, *argv: str) -> tuple[str, dict[str, Any]]:
    sent: list[tuple[str, dict[str, Any]]] = []

    def agent(args: Any, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append((verb, body))
        return {}

    monkeypatch.setattr(cli.main, "_agent", agent)
    args = cli.main.build_parser().parse_args([*argv, "--token", "sbk_x"])
    assert args.fn(args) == 0
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
    sent: list[tuple[str, dict[str, Any]]] = []

    def agent(args: Any, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append((verb, body))
        return {"webhooks": [{"webhook_id": "wh_1", "target_queue": "work"}], "ceiling": {"allowed_queues": ["work"]}}

    monkeypatch.setattr(cli.main, "_agent", agent)
    args = cli.main.build_parser().parse_args(
        ["rules", "install", "--webhook", "wh_1", "--pack", str(rules), "--force", "--token", "sbk_x"]
    )
    assert args.fn(args) == 0
    assert [verb for verb, _ in sent] == ["list_webhooks", "set_webhook_rules"] and sent[1][1]["force"] is True


def test_every_agent_command_is_in_the_readme() -> None:
    commands = {name: verb.cli for name, verb in REGISTRY.items() if verb.cli is not None}
    assert set(commands) >= {"retry_todo", "cancel_todo", "get_reroute"}
    for name, command in commands.items():
        assert f"`{name}`" in CLI_DOC, name
        assert f"switchboard {command.group} {command.action}" in CLI_DOC, name


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
    assert parser.parse_args(["human", "list"]).output is None


def test_the_api_url_is_the_bind_address_never_the_public_url() -> None:
    public = {"SWITCHBOARD_PUBLIC_URL": "https://hooks.example.com"}
    assert api_url(None, public) == "http://127.0.0.1:8000"
    wildcard = {**public, "SWITCHBOARD_HTTP_HOST": "0.0.0.0", "SWITCHBOARD_HTTP_PORT": "9000"}
    assert api_url(None, wildcard) == "http://127.0.0.1:9000"
    assert api_url(None, {"SWITCHBOARD_HTTP_HOST": "::"}) == "http://[::1]:8000"
    assert api_url(None, {"SWITCHBOARD_HTTP_HOST": "10.0.0.5"}) == "http://10.0.0.5:8000"
    assert api_url("http://api:8000/", {}) == "http://api:8000"
    assert api_url(None, {**public, "SWITCHBOARD_URL": "http://from-env:1"}) == "http://from-env:1"
    with pytest.raises(CliError) as bad:
        api_url("api:8000", {})
    assert bad.value.code == "invalid_url"
    with pytest.raises(CliError) as port:
        api_url(None, {"SWITCHBOARD_HTTP_PORT": "eighty"})
    assert port.value.code == "invalid_setting" and "SWITCHBOARD_HTTP_PORT" in port.value.message


def test_the_client_defaults_are_the_services_settings_defaults() -> None:
    # The client reads the bind address and data folder without importing Settings; the defaults must agree.
    fields = Settings.model_fields
    assert fields["http_host"].default == client.DEFAULT_HTTP_HOST
    assert fields["http_port"].default == client.DEFAULT_HTTP_PORT
    assert fields["home"].default == Path(client.DEFAULT_HOME)
    names = {client.HOST_ENV, client.PORT_ENV, client.HOME_ENV, client.ADMIN_TOKEN_ENV}
    assert names == {"SWITCHBOARD_" + f.upper() for f in ("http_host", "http_port", "home", "admin_token")}


def test_the_admin_token_is_read_never_generated(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"SWITCHBOARD_HOME": str(home)}
    with pytest.raises(CliError) as missing:
        admin_token(None, env)
    assert missing.value.code == "missing_admin_token" and not home.exists()
    home.mkdir()
    (home / "admin_token").write_text("sba_file\n")
    assert admin_token(None, env) == "sba_file"
    assert admin_token(None, {**env, "SWITCHBOARD_ADMIN_TOKEN": "sba_env"}) == "sba_env"
    assert admin_token("sba_flag", {**env, "SWITCHBOARD_ADMIN_TOKEN": "sba_env"}) == "sba_flag"


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


def test_the_checked_in_command_description_is_the_verb_table() -> None:
    # cli/commands.json is what client commands read instead of importing the API; regenerate it with
    # `.venv/bin/python -m cli.commands` after changing a verb's `cli=`.
    assert commands.load() == commands.generate(), "cli/commands.json is stale: run python -m cli.commands"
    used_types = {a["type"] for c in commands.load()["commands"] for a in c["args"]} - {None}
    assert used_types <= set(commands.CONVERTERS)
    assert set(get_args(ArgType)) == set(commands.CONVERTERS)
    assert set(get_args(Completer)) == set(commands.COMPLETERS)


def test_a_client_command_imports_neither_the_api_nor_temporal_nor_psycopg(tmp_path: Path) -> None:
    # The whole client path, parse to answer, in a fresh interpreter: what it loaded is what it cost.
    code = """
import sys
import cli.main
for argv in (["--version"], ["--url", "http://127.0.0.1:9", "--token", "sbk_x", "todos", "list"],
             ["send", "stripe", "--ingest-url", "http://127.0.0.1:9/webhooks/w/x", "--secret", "whsec_x"],
             ["completion", "bash"], ["--token", "sbk_x", "--url", "http://127.0.0.1:9", "tail"],
             ["--token", "sbk_x", "--url", "http://127.0.0.1:9", "rules", "install", "--webhook", "wh_1", "--pack", "starter"],
             ["--token", "sbk_x", "--url", "http://127.0.0.1:9", "events", "reroute", "ev_1"]):
    try:
        cli.main.main(argv)
    except SystemExit:
        pass
print("loaded:", *sorted({name.split(".")[0] for name in sys.modules}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True
    )
    loaded = set(done.stdout.splitlines()[-1].split()[1:])
    assert "cli" in loaded and "routing" in loaded  # send signs with routing/signatures.py
    heavy = {"fastapi", "starlette", "temporalio", "psycopg", "psycopg_pool", "pydantic", "httpx", "openai", "api"}
    assert loaded & heavy == set()


def test_export_prints_shell_assignments_for_the_next_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = {
        "vend_endpoint": {"endpoint_id": "ep_1", "credential": "sbk_a'b", "queues": ["work"]},
        "create_webhook": {"webhook_id": "wh_1", "ingest_url": "http://h/webhooks/w/t", "secret": None},
        "claim_next": {"empty": False, "todo": {"id": "td_1", "state": "claimed"}},
    }
    monkeypatch.setattr(cli.main, "_admin", lambda args, verb, body: answers[verb])
    monkeypatch.setattr(cli.main, "_agent", lambda args, verb, body: answers[verb])
    assert cli.main.main(["endpoint", "vend", "--agent", "ag_1", "--queues", "work", "--export"]) == 0
    out, err = capsys.readouterr()
    assert out == "export ENDPOINT_ID=ep_1\nexport SWITCHBOARD_TOKEN='sbk_a'\"'\"'b'\n"
    assert "credential: sbk_a'b" in err  # the answer itself, for the person, on standard error
    assert cli.main.main(["--export", "--token", "t", "webhooks", "create", "generic", "--queue", "work"]) == 0
    out, _ = capsys.readouterr()
    # A generic webhook has no secret: an earlier webhook's secret is unset, never left behind.
    assert out.splitlines() == [
        "export WEBHOOK_ID=wh_1",
        "export SWITCHBOARD_INGEST_URL=http://h/webhooks/w/t",
        "unset SWITCHBOARD_WEBHOOK_SECRET",
    ]
    assert cli.main.main(["todos", "claim-next", "--token", "t", "--export"]) == 0
    assert capsys.readouterr().out == "export TODO_ID=td_1\n"
    # A command with nothing to export says so (exit 2), and never prints half an answer.
    assert cli.main.main(["--export", "--token", "t", "todos", "list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("switchboard: invalid_argument: --export")


def test_send_signs_every_source_as_its_producer_does() -> None:
    from cli import send
    from routing.signatures import GenericHmac
    from routing.sources import SOURCE_TYPES, verify

    assert cli.main.SEND_SOURCES == SOURCE_TYPES
    now = 1_800_000_000.0
    for source in SOURCE_TYPES:
        raw, headers = send.prepare(source, "whsec_test", now=now)
        verdict = verify(source, b"whsec_test", headers, raw, now)
        assert verdict.ok, (source, verdict)
        assert verdict.verified == (source != "generic"), source
        # Every send is a new delivery: the producer's id differs from one send to the next.
        again_raw, again = send.prepare(source, "whsec_test", now=now)
        assert (raw, headers) != (again_raw, again), source
    _, forge = send.prepare("gitea", "s", event="push", delivery_id="d-1", now=now)
    assert forge["x-gitea-event"] == "push" and forge["x-gitea-delivery"] == "d-1"
    # A body's own producer id is kept (a redelivery), unless --delivery-id says otherwise.
    body = json.dumps({"id": "evt_mine", "type": "invoice.paid"}).encode()
    assert json.loads(send.prepare("stripe", "s", body=body, now=now)[0])["id"] == "evt_mine"
    assert json.loads(send.prepare("stripe", "s", body=body, delivery_id="evt_2", now=now)[0])["id"] == "evt_2"
    cairn = json.loads(send.prepare("cairn", "s", body=b'{"kind": "artifact.created"}', now=now)[0])
    assert cairn["created_at"] == "2027-01-15T08:00:00Z" and cairn["event_id"].startswith("send-")
    with pytest.raises(CliError) as missing:
        send.prepare("github", None)
    assert missing.value.code == "missing_secret" and "SWITCHBOARD_WEBHOOK_SECRET" in missing.value.message
    with pytest.raises(CliError) as wrong:
        send.prepare("stripe", "s", event="charge.paid")
    assert wrong.value.code == "invalid_argument"
    raw, headers = send.prepare("generic", None, headers=["X-Extra: 1"])
    assert headers["x-extra"] == "1" and "x-delivery-id" in headers
    # A generic collector with an HMAC: signed in its header and encoding, verified as the receiver does.
    config = GenericHmac(header="X-Sig", format="base64")
    raw, headers = send.prepare("generic", "hmac-secret", hmac=config, now=now)
    assert verify("generic", b"hmac-secret", headers, raw, now, generic_hmac=config).verified is True
    with pytest.raises(CliError):
        send.prepare("github", "s", hmac=config)
