"""The `switchboard` client commands as a user runs them: a subprocess in an empty folder, against a live API.

The API is the suite's stack (real PostgreSQL and Temporal) served on a real localhost port; the command gets
only flags and environment variables, never the suite's settings or its working folder.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from cli.tail import READY
from tests.conftest import Stack
from tests.helpers import eventually, issue_payload, post_github

BIN = Path(sys.executable).parent / "switchboard"


def base_env(home: Path) -> dict[str, str]:
    """A clean environment: no SWITCHBOARD_* of the suite's process leaks into the command."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8"}


def sb(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)


async def asb(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command while the test's event loop keeps serving the API."""
    return await asyncio.to_thread(sb, cwd, env, *args)


async def ok_json(cwd: Path, env: dict[str, str], *args: str) -> Any:
    done = await asb(cwd, env, *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.fixture
def public_listener() -> Iterator[tuple[str, socket.socket]]:
    """A fake SWITCHBOARD_PUBLIC_URL: a listening socket that must never see a connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", sock
    sock.close()


def assert_never_connected(sock: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        sock.accept()


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def test_version_and_what_is_missing_from_another_folder(elsewhere: Path) -> None:
    env = base_env(elsewhere)
    done = sb(elsewhere, env, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"switchboard {version('switchboard')}"

    # No admin token anywhere: said in one line, and nothing is generated (a new token could only get 401).
    done = sb(elsewhere, env, "human", "list")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("switchboard: missing_admin_token: ")
    assert "--admin-token" in done.stderr and "SWITCHBOARD_ADMIN_TOKEN" in done.stderr
    assert not (elsewhere / ".switchboard").exists()

    done = sb(elsewhere, env, "todos", "list")
    assert done.returncode == 2 and done.stderr.startswith("switchboard: missing_token: ")
    assert "--token" in done.stderr and "SWITCHBOARD_TOKEN" in done.stderr

    # Nothing listens there: the stable code, the URL, and how to point elsewhere.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    done = sb(elsewhere, {**env, "SWITCHBOARD_URL": f"http://127.0.0.1:{closed}"}, "--token", "sbk_x", "todos", "list")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"switchboard: unreachable: cannot reach http://127.0.0.1:{closed}")
    assert len(done.stderr.strip().splitlines()) == 1


async def test_admin_lists_reach_the_bind_address_never_the_public_url(
    live_stack: Stack, elsewhere: Path, public_listener: tuple[str, socket.socket]
) -> None:
    public_url, listener = public_listener
    env = {
        **base_env(elsewhere),
        "SWITCHBOARD_HTTP_HOST": "127.0.0.1",
        "SWITCHBOARD_HTTP_PORT": port_of(live_stack.base_url),
        "SWITCHBOARD_PUBLIC_URL": public_url,
        "SWITCHBOARD_ADMIN_TOKEN": str(live_stack.settings.admin_token),
    }
    human = (await ok_json(elsewhere, env, "human", "create", "--name", "ann"))["human_id"]
    other = (await ok_json(elsewhere, env, "human", "create", "--name", "bob"))["human_id"]
    agent = (await ok_json(elsewhere, env, "agent", "create", "--human", human, "--name", "bot"))["agent_id"]
    vended = await ok_json(elsewhere, env, "endpoint", "vend", "--agent", agent, "--queues", "work")
    credential = vended["credential"]

    humans = await ok_json(elsewhere, env, "human", "list")
    assert [h["human_id"] for h in humans["humans"]] == [other, human]  # newest first
    assert humans["humans"][1]["agents"] == 1
    page = await ok_json(elsewhere, env, "human", "list", "--limit", "1")
    assert [h["human_id"] for h in page["humans"]] == [other] and page["next_cursor"]
    rest = await ok_json(elsewhere, env, "human", "list", "--limit", "1", "--cursor", page["next_cursor"])
    assert [h["human_id"] for h in rest["humans"]] == [human] and rest.get("next_cursor") is None

    agents = await ok_json(elsewhere, env, "agent", "list", "--human", human)
    assert [(a["agent_id"], a["live_endpoints"]) for a in agents["agents"]] == [(agent, 1)]
    assert (await ok_json(elsewhere, env, "agent", "list", "--human", other))["agents"] == []

    done = await asb(elsewhere, env, "endpoint", "list", "--agent", agent)
    assert done.returncode == 0, done.stderr
    [endpoint] = json.loads(done.stdout)["endpoints"]
    assert endpoint["endpoint_id"] == vended["endpoint_id"] and endpoint["state"] == "live"
    assert endpoint["credential_prefix"] == credential[:12] and endpoint["queues"] == ["work"]
    # No secret of any kind: not the credential, not its hash (under any name).
    assert credential not in done.stdout and "hash" not in done.stdout and 'credential"' not in done.stdout

    # A revoked endpoint is listed as such, found by the id the listing gave.
    await ok_json(elsewhere, env, "endpoint", "revoke", endpoint["endpoint_id"])
    revoked = await ok_json(elsewhere, env, "endpoint", "list", "--state", "revoked")
    assert [e["endpoint_id"] for e in revoked["endpoints"]] == [endpoint["endpoint_id"]]
    assert (await ok_json(elsewhere, env, "endpoint", "list", "--state", "live"))["endpoints"] == []

    # A table on request: a header and a row per endpoint, not JSON.
    done = await asb(elsewhere, env, "--table", "endpoint", "list")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split()[:4] == ["ENDPOINT_ID", "AGENT_ID", "HUMAN_ID", "STATE"]
    assert row.split()[:4] == [endpoint["endpoint_id"], agent, human, "revoked"]

    # A wrong admin token: the API's code in one line, exit 1.
    done = await asb(elsewhere, {**env, "SWITCHBOARD_ADMIN_TOKEN": "sba_wrong"}, "human", "list")
    assert done.returncode == 1 and done.stderr.startswith("switchboard: unauthenticated: ")
    assert "Traceback" not in done.stderr

    # The admin verbs are the operator's only: an endpoint credential cannot list humans.
    resp = await live_stack.http.post("/v1/list_humans", json={}, headers={"Authorization": f"Bearer {credential}"})
    assert resp.status_code in (401, 404)

    assert_never_connected(listener)


async def test_owner_commands_see_only_their_own_and_print_tables_or_json(
    live_stack: Stack, elsewhere: Path, public_listener: tuple[str, socket.socket], tmp_path: Path
) -> None:
    public_url, listener = public_listener
    mine, theirs = await live_stack.agent(), await live_stack.agent()
    hooks = {}
    for agent in (mine, theirs):
        hooks[agent.endpoint_id] = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    delivered = {}
    for agent in (mine, theirs):
        resp = await post_github(live_stack.http, hooks[agent.endpoint_id], issue_payload(title="cli test"))
        assert resp.status_code == 202, resp.text
        delivered[agent.endpoint_id] = resp.json()
    my_hook, my_event = hooks[mine.endpoint_id]["webhook_id"], delivered[mine.endpoint_id]["event_id"]
    [my_todo] = [t["id"] for t in delivered[mine.endpoint_id]["todos"]]
    their_event = delivered[theirs.endpoint_id]["event_id"]
    env = {
        **base_env(elsewhere),
        "SWITCHBOARD_URL": live_stack.base_url,
        "SWITCHBOARD_PUBLIC_URL": public_url,
        "SWITCHBOARD_TOKEN": mine.credential,
    }

    webhooks = await ok_json(elsewhere, env, "webhooks", "list")
    assert [w["webhook_id"] for w in webhooks["webhooks"]] == [my_hook]
    assert "secret" not in json.dumps(webhooks)
    events = await ok_json(elsewhere, env, "events", "list")
    assert [e["id"] for e in events["events"]] == [my_event]  # never the other human's
    shown = await ok_json(elsewhere, env, "events", "show", my_event)
    assert shown["id"] == my_event and shown["payload"]["issue"]["title"] == "cli test"
    done = await asb(elsewhere, env, "events", "show", their_event)
    assert done.returncode == 1 and done.stderr.startswith("switchboard: not_found: ")
    todos = await ok_json(elsewhere, env, "todos", "list", "--state", "pending")
    assert [t["id"] for t in todos["todos"]] == [my_todo]
    assert (await ok_json(elsewhere, env, "todos", "get", my_todo))["todo"]["event_id"] == my_event

    # Rules: set from a file, list, test on a sample, backtest over the stored event.
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps([{"id": "drop-push", "expr": '.kind == "push"', "action": {"drop": True}}]))
    saved = await ok_json(elsewhere, env, "rules", "set", my_hook, "--file", str(rules_file))
    assert [r["id"] for r in saved["rules"]] == ["drop-push"]
    assert [r["id"] for r in (await ok_json(elsewhere, env, "rules", "list", my_hook))["rules"]] == ["drop-push"]
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps(issue_payload()))
    tried = await ok_json(elsewhere, env, "rules", "test", my_hook, "--payload", str(sample), "--omit-envelope")
    assert tried["decision"]["disposition"] == "routed" and tried["envelope"] is None
    tried = await ok_json(elsewhere, env, "rules", "test", my_hook, "--event", my_event)
    assert tried["event_id"] == my_event
    back = await ok_json(elsewhere, env, "rules", "backtest", my_hook, "--limit", "10")
    assert [e["event_id"] for e in back["events"]] == [my_event] and back["summary"]["events"] == 1
    assert (await ok_json(elsewhere, env, "schedules", "list"))["schedules"] == []

    # Into a pipe the answer is JSON (above); `--table` gives columns a person reads, cut to one line a row.
    done = await asb(elsewhere, env, "todos", "list", "--table")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()
    assert header.split() == ["ID", "QUEUE", "STATE", "ATTEMPT", "KIND", "TITLE", "OWNER", "CREATED_AT"]
    assert row.split()[:4] == [my_todo, "work", "pending", "0"]
    done = await asb(elsewhere, env, "--table", "events", "show", my_event)
    assert done.returncode == 0 and f"id: {my_event}" in done.stdout.splitlines()

    # Bad input to a command: argparse's usage line, no traceback.
    done = await asb(elsewhere, env, "rules", "set", my_hook, "--file", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "cannot read" in done.stderr and "Traceback" not in done.stderr

    assert_never_connected(listener)


async def test_a_reader_that_goes_away_is_no_traceback(live_stack: Stack, elsewhere: Path) -> None:
    agent = await live_stack.agent()
    env = {**base_env(elsewhere), "SWITCHBOARD_URL": live_stack.base_url, "SWITCHBOARD_TOKEN": agent.credential}

    # `switchboard todos list | head -1` where head has already gone: the write fails with EPIPE.
    def run() -> tuple[int, str]:
        proc = subprocess.Popen(
            [str(BIN), "todos", "list", "--table"], cwd=elsewhere, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        proc.stdout.close()  # the reader goes away before the command writes
        _, err = proc.communicate(timeout=180)
        return proc.returncode, err

    code, err = await asyncio.to_thread(run)
    assert code == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_completion_scripts(elsewhere: Path) -> None:
    env = base_env(elsewhere)
    script = sb(elsewhere, env, "completion", "bash")
    assert script.returncode == 0
    (elsewhere / "switchboard.bash").write_text(script.stdout)

    def complete(*words: str) -> list[str]:
        probe = (
            f"source {elsewhere / 'switchboard.bash'}; COMP_WORDS=(switchboard {' '.join(words)});"
            f" COMP_CWORD={len(words)}; _switchboard; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        )
        done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
        return done.stdout.split()

    assert set(complete("")) >= {"human", "agent", "endpoint", "todos", "events", "rules", "tail", "--version"}
    assert complete("hu") == ["human"]
    assert set(complete("endpoint", "")) >= {"vend", "revoke", "list"}
    assert set(complete("rules", "")) >= {"list", "set", "test", "backtest", "install"}
    assert complete("endpoint", "list", "--state", "") == ["live", "revoked"]
    assert complete("todos", "list", "--st") == ["--state"]
    assert complete("--json", "todos", "list", "--queue", "") == []  # a free value: nothing of ours
    assert complete("completion", "f") == ["fish"]

    zsh = sb(elsewhere, env, "completion", "zsh").stdout
    assert "bashcompinit" in zsh and "complete -o default -F _switchboard switchboard" in zsh
    fish = sb(elsewhere, env, "completion", "fish").stdout
    assert "complete -c switchboard -n 'test (__switchboard_path) = sb' -a human" in fish
    assert "-n 'test (__switchboard_path) = sb/endpoint/list' -l state" in fish


async def test_tail_follows_a_new_event_and_todo(live_stack: Stack, elsewhere: Path) -> None:
    agent = await live_stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    old = await post_github(live_stack.http, webhook, issue_payload(number=1))
    assert old.status_code == 202, old.text
    env = {**base_env(elsewhere), "SWITCHBOARD_URL": live_stack.base_url, "SWITCHBOARD_TOKEN": agent.credential}
    proc = await asyncio.create_subprocess_exec(
        str(BIN), "tail", "--json", "--interval", "0.2", cwd=elsewhere, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        ready = await asyncio.wait_for(proc.stderr.readline(), 180)
        assert ready.decode().strip() == READY

        resp = await post_github(live_stack.http, webhook, issue_payload(number=2, title="live one"))
        assert resp.status_code == 202, resp.text
        event_id, [todo] = resp.json()["event_id"], resp.json()["todos"]
        await agent.ok("claim", {"todo_id": todo["id"]})

        lines: list[dict[str, Any]] = []

        async def seen() -> bool:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)  # type: ignore[union-attr]
            lines.append(json.loads(line))
            kinds = {(x["type"], x["id"], x.get("previous_state"), x.get("state")) for x in lines}
            return ("event", event_id, None, None) in kinds and any(
                k[:2] == ("todo", todo["id"]) and k[3] == "claimed" for k in kinds
            )

        await eventually(seen, timeout=120, interval=0)
        # Only what arrived after tail started: the earlier delivery is not replayed.
        assert old.json()["event_id"] not in {x["id"] for x in lines}
        event_line = next(x for x in lines if x["type"] == "event")
        assert event_line["todo_ids"] == [todo["id"]] and event_line["disposition"] == "routed"
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 60)
        rest = await proc.stderr.read()
    assert code == 130 and b"Traceback" not in rest, rest


async def test_send_delivers_a_signed_delivery_of_every_source_type(live_stack: Stack, elsewhere: Path) -> None:
    agent = await live_stack.agent(webhook_max=6)
    env = {**base_env(elsewhere), "SWITCHBOARD_URL": live_stack.base_url, "SWITCHBOARD_TOKEN": agent.credential}
    senders = {}
    for source in ("github", "gitea", "stripe", "slack", "cairn", "generic"):
        made = await asb(elsewhere, env, "webhooks", "create", source, "--queue", "work", "--export")
        assert made.returncode == 0, made.stderr
        exported = dict(line.removeprefix("export ").split("=", 1) for line in made.stdout.splitlines() if "=" in line)
        # The ingest URL names the suite's public URL; the same path on the served stack.
        path = exported["SWITCHBOARD_INGEST_URL"].split("/webhooks/", 1)[1]
        sender = {**env, "SWITCHBOARD_INGEST_URL": f"{live_stack.base_url}/webhooks/{path}"}
        if "SWITCHBOARD_WEBHOOK_SECRET" in exported:
            sender["SWITCHBOARD_WEBHOOK_SECRET"] = exported["SWITCHBOARD_WEBHOOK_SECRET"]
        else:
            assert source == "generic" and "unset SWITCHBOARD_WEBHOOK_SECRET" in made.stdout
        senders[source] = sender
        sent = await asb(elsewhere, sender, "send", source, "--delivery-id", f"d-{source}")
        assert sent.returncode == 0, sent.stderr
        assert sent.stderr.splitlines()[0] == "HTTP 202 Accepted", sent.stderr
        answer = json.loads(sent.stdout)
        assert answer["created"] == 1 and answer["verified"] is (source != "generic"), (source, answer)
        again = await asb(elsewhere, sender, "send", source, "--delivery-id", f"d-{source}")
        assert json.loads(again.stdout)["duplicate"] is True, source
    kinds = dict(live_stack.sql("SELECT source, kind FROM events"))
    assert kinds == {
        "github": "issues",
        "gitea": "issues",
        "stripe": "payment_intent.succeeded",
        "slack": "app_mention",
        "cairn": "artifact.created",
        "generic": None,
    }
    # A wrong secret is the receiver's 401, printed the same way; the command exits 1.
    wrong = await asb(elsewhere, {**senders["stripe"], "SWITCHBOARD_WEBHOOK_SECRET": "whsec_wrong"}, "send", "stripe")
    assert wrong.returncode == 1 and wrong.stderr.splitlines()[0] == "HTTP 401 Unauthorized", wrong.stderr
    assert json.loads(wrong.stdout) == {"error": "signature verification failed"}


async def test_the_starter_pack_installs_on_a_work_queue_and_a_pack_needing_more_says_which(
    live_stack: Stack, elsewhere: Path
) -> None:
    # A newcomer's endpoint: one queue, `work`, as the README's walkthrough vends it.
    agent = await live_stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    env = {**base_env(elsewhere), "SWITCHBOARD_URL": live_stack.base_url, "SWITCHBOARD_TOKEN": agent.credential}
    hook = webhook["webhook_id"]

    # fleet routes to lanes this endpoint cannot name: refused before anything is saved, naming them and the fix.
    done = await asb(elsewhere, env, "rules", "install", "--webhook", hook, "--pack", "fleet")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"switchboard: not_granted: pack fleet routes to hold, lane-l, lane-m, lane-s, lane-vision, triage; webhook"
        f" {hook} may route only to work, so hold, lane-l, lane-m, lane-s, lane-vision, triage must be granted. An"
        " endpoint's queues are fixed when it is vended: vend one that has them (switchboard endpoint vend --agent"
        " ag_… --queues work,hold,lane-l,lane-m,lane-s,lane-vision,triage), create the webhook with its credential"
        " and install again"
    )
    done = await asb(elsewhere, env, "rules", "install", "--webhook", hook, "--pack", "starter", "--queue", "bugs=bugs")
    assert done.returncode == 1 and "so bugs must be granted" in done.stderr and "--queue NAME=QUEUE" in done.stderr
    assert live_stack.sql("SELECT routing_rules FROM endpoint_webhooks WHERE id = %s", hook) == [([],)]

    installed = await ok_json(elsewhere, env, "rules", "install", "--webhook", hook, "--pack", "starter")
    assert installed["on_fault"] == "hold" and installed["default_action"] == {"drop": True}
    assert [r["id"] for r in installed["rules"]][-4:] == ["bug", "feature", "question", "new-issue"]

    labeled = issue_payload(number=5, title="crash on save")
    labeled["issue"]["labels"] = [{"name": "bug"}]
    resp = await post_github(live_stack.http, webhook, labeled)
    assert resp.status_code == 202 and [t["queue"] for t in resp.json()["todos"]] == ["work"], resp.text
    [(trace,)] = live_stack.sql("SELECT routing_trace FROM events WHERE id = %s", resp.json()["event_id"])
    assert trace["rule_id"] == "bug"
    closed = issue_payload(number=6, action="closed")
    closed["issue"]["state"] = "closed"
    for noise in (closed, issue_payload(number=7, action="edited")):
        resp = await post_github(live_stack.http, webhook, noise)
        assert resp.status_code == 202 and resp.json()["dropped"] is True, resp.text
    resp = await post_github(live_stack.http, webhook, {"zen": "Keep it logically awesome."}, event="ping")
    assert resp.status_code == 202 and resp.json()["dropped"] is True, resp.text
    assert live_stack.sql("SELECT count(*) FROM todos")[0][0] == 1
