"""The verb table's commands as data: `cli/commands.json`, generated from the registry and checked in.

A client command starts by reading this file instead of importing the verb table, which would import the whole
service (FastAPI, Temporal, psycopg, the model client) just to build the argument parser. The registry stays the
one source: `python -m cli.commands` rewrites the file from it, and tests/test_cli.py fails while the two differ.
The named argument types and completers of the registry (api/verbs/registry.py `ArgType`, `Completer`) are
implemented here, where the command line runs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from routing.text import loads_bounded

COMMANDS_FILE = Path(__file__).with_name("commands.json")


def csv(value: str) -> list[str]:
    """A comma-separated command-line list."""
    return [v.strip() for v in value.split(",") if v.strip()]


def json_file(value: str) -> Any:
    """A command-line argument naming a JSON file (`-`: standard input), parsed."""
    try:
        text = sys.stdin.read() if value == "-" else Path(value).read_text()
        return loads_bounded(text)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {value}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value} is not JSON: {exc}") from None


def secret_file(value: str) -> str:
    """A command-line argument naming a file that holds a secret (`-`: standard input), read and stripped: a secret
    is never typed on a command line, where `ps` and the shell's history would show it."""
    try:
        text = sys.stdin.read() if value == "-" else Path(value).read_text()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {value}: {exc.strerror or exc}") from None
    return text.strip()


def rate(value: str) -> float | None:
    """Deliveries per second, or `default` (null: the operator default)."""
    return None if value == "default" else float(value)


CONVERTERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "csv": csv,
    "json_file": json_file,
    "rate": rate,
    "secret_file": secret_file,
}


def vend_defaults(body: dict[str, Any], agent_verbs: Sequence[str]) -> dict[str, Any]:
    """`--verbs all` is every agent verb; the webhook queues default to the endpoint's own queues."""
    verbs = body["verbs"]
    return {
        **body,
        "verbs": list(agent_verbs) if verbs == "all" else csv(verbs),
        "webhook_queues": body["webhook_queues"] if body["webhook_queues"] is not None else body["queues"],
    }


def spread_config(body: dict[str, Any], agent_verbs: Sequence[str]) -> dict[str, Any]:
    """A rules command's input with its `config` file spread into the configuration fields.

    The file is a JSON object of `rules`, `default_action`, `params`, `on_fault` (a rule pack's shape), or a bare
    rules array. Other keys are refused by the verb's own validation, naming them.
    """
    body = dict(body)
    config = body.pop("config", None)
    if config is None:
        return body
    if isinstance(config, list):
        config = {"rules": config}
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError("a rules file is a JSON object (rules, default_action, …) or a rules array")
    return {**config, **body}


def reconciler_scope(body: dict[str, Any], agent_verbs: Sequence[str]) -> dict[str, Any]:
    """`reconciler set`'s `--repo`, `--org` or `--app` as the verb's `scope`, its `--token-file` as `token`."""
    body = dict(body)
    scope = {k: body.pop(k) for k in ("repo", "org", "app") if body.get(k) is not None}
    if "github_token" in body:
        body["token"] = body.pop("github_token")
    return {**body, "scope": scope}


def trust_flags(body: dict[str, Any], agent_verbs: Sequence[str]) -> dict[str, Any]:
    """`webhooks trust` flags as the verb's trusted_actors: --allow-all, --logins with --match, --actor-ids, --clear."""
    out: dict[str, Any] = {"webhook_id": body["webhook_id"]}
    if body.get("clear"):
        out["trusted_actors"] = None
    elif body.get("allow_all"):
        out["trusted_actors"] = {"allow_all": True}
    elif body.get("logins") is not None:
        out["trusted_actors"] = {"logins": csv(body["logins"]), "match": body.get("match") or "both"}
    elif body.get("actor_ids") is not None:
        out["trusted_actors"] = {"actor_ids": csv(body["actor_ids"])}
    return out


COMPLETERS: dict[str, Callable[[dict[str, Any], Sequence[str]], dict[str, Any]]] = {
    "vend_defaults": vend_defaults,
    "spread_config": spread_config,
    "reconciler_scope": reconciler_scope,
    "trust_flags": trust_flags,
}


def load() -> dict[str, Any]:
    """The checked-in description: `{"agent_verbs": [...], "commands": [...]}`."""
    loaded: dict[str, Any] = json.loads(COMMANDS_FILE.read_text())
    return loaded


def generate() -> dict[str, Any]:
    """The description of every verb command, from the verb table (imports the whole API)."""
    from api.verbs import ADMIN_VERBS, REGISTRY

    commands = []
    for verb in [*ADMIN_VERBS.values(), *REGISTRY.values()]:
        if verb.cli is not None:
            commands.append({"verb": verb.name, "surface": verb.surface, **dataclasses.asdict(verb.cli)})
    # Through JSON once, so tuples compare as the lists the file holds.
    described: dict[str, Any] = json.loads(json.dumps({"agent_verbs": list(REGISTRY), "commands": commands}))
    return described


def render(described: dict[str, Any]) -> str:
    """The file's text: stable, one key per line, so a change reads as a small diff."""
    return json.dumps(described, indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    COMMANDS_FILE.write_text(render(generate()))
    print(f"wrote {COMMANDS_FILE}")
