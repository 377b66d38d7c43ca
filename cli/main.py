"""The switchboard command: dev stack, service processes and operator verbs (one command per admin verb).

Client commands (every command but the service ones) use the standard library and the modules under cli/ only:
their parser comes from cli/commands.json (the verb table as data), so `switchboard todos list` does not import the
API, Temporal or psycopg. The service commands import their stack when they run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from cli import commands, completion, output
from cli.client import ADMIN_TOKEN_ENV, TOKEN_ENV, URL_ENV, CliError, admin_token, api_url, call, owner_token
from cli.packs import RULE_PACKS, load_pack, pack_document, pack_queues
from cli.services import cmd_api, cmd_dev, cmd_migrate, cmd_worker, cmd_worker_health
from cli.tail import Tail


def _admin(args: argparse.Namespace, verb: str, body: dict[str, Any]) -> Any:
    """POST one admin verb with the admin token to the API (never to SWITCHBOARD_PUBLIC_URL); its answer."""
    return call(api_url(args.url), f"/admin/v1/{verb}", admin_token(args.admin_token), body, timeout=30)


def _agent(args: argparse.Namespace, verb: str, body: dict[str, Any]) -> Any:
    """POST one agent verb with the owner's endpoint credential; its answer."""
    token = owner_token(args.token)
    return call(api_url(args.url), f"/v1/{verb}", token, body)


def _emit(args: argparse.Namespace, answer: Any, columns: Any = (), exports: Any = ()) -> int:
    if args.output == "export":
        # The answer for the person on standard error; the shell's assignments on standard output.
        lines, hints = output.render(answer, tuple(columns))
        print("\n".join([*lines, *hints]), file=sys.stderr)
        print(export_lines(answer, exports), end="")
        return 0
    output.emit(answer, output.mode(args.output), tuple(columns))
    return 0


def export_lines(answer: Any, exports: Any) -> str:
    """`export NAME=value` for each of a command's exports found in the answer (`unset NAME` where it is null)."""
    if not exports:
        raise CliError("invalid_argument", "--export: this command's answer has nothing to export")
    lines = []
    for spec in exports:
        value: Any = answer
        for key in spec["path"].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        name = spec["name"]
        if value is None:
            lines.append(f"unset {name}")
        else:
            lines.append(f"export {name}={shlex.quote(value if isinstance(value, str) else json.dumps(value))}")
    return "".join(line + "\n" for line in lines)


def cmd_rules_install(args: argparse.Namespace) -> int:
    try:
        body = load_pack(args.pack, args.params_file, args.param, args.queue)
        mappable = "queues" in pack_document(args.pack)
    except (OSError, ValueError) as exc:
        print(f"cannot load pack: {exc}", file=sys.stderr)
        return 2
    if "REPLACE-" in json.dumps(body.get("params")):
        # Placeholders match no real login, so the pack fails closed; say so rather than install silently.
        print("warning: params still hold REPLACE-… placeholders; the pack will fail closed", file=sys.stderr)
    if args.force:
        body["force"] = True
    _check_granted(args, args.pack, pack_queues(body), mappable=mappable)
    return _emit(args, _agent(args, "set_webhook_rules", {"webhook_id": args.webhook_id, **body}))


def _check_granted(args: argparse.Namespace, pack: str, needed: list[str], *, mappable: bool) -> None:
    """Refuse, before saving, a pack that routes to queues the webhook may not name, saying which and what to do.

    A rule may name the webhook's target queue and its owner endpoint's webhook queues (fixed when the endpoint was
    vended); the save would refuse the first queue outside them. A webhook this endpoint does not own is left to the
    save's own answer, and so is an endpoint whose scope lacks list_webhooks.
    """
    try:
        listed = _agent(args, "list_webhooks", {})
    except CliError as exc:
        if exc.code == "forbidden":
            return
        raise
    [webhook] = [w for w in listed["webhooks"] if w["webhook_id"] == args.webhook_id] or [None]
    if webhook is None:
        return
    granted = [
        webhook["target_queue"],
        *(q for q in listed["ceiling"]["allowed_queues"] if q != webhook["target_queue"]),
    ]
    missing = [q for q in needed if q not in granted]
    if not missing:
        return
    mapped = "; or map the pack's queues onto granted ones with --queue NAME=QUEUE" if mappable else ""
    raise CliError(
        "not_granted",
        f"pack {pack} routes to {', '.join(needed)}; webhook {args.webhook_id} may route only to"
        f" {', '.join(granted)}, so {', '.join(missing)} must be granted. An endpoint's queues are fixed when it is"
        f" vended: vend one that has them (switchboard endpoint vend --agent ag_… --queues"
        f" {','.join(dict.fromkeys([*granted, *missing]))}), create the webhook with its credential and install"
        f" again{mapped}",
        exit_code=1,
    )


REROUTE_POLL_SECONDS = 1.0


def cmd_events_reroute(args: argparse.Namespace) -> int:
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
    answer = _agent(args, verb, body)
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
        polled = _agent(args, "get_reroute", {"workflow_id": answer["workflow_id"]})
        if not isinstance(polled, dict) or polled.get("status") != "running":
            return _emit(args, polled)


TAIL_INTERVAL = 1.0
SEND_SOURCES = ("github", "gitea", "stripe", "slack", "cairn", "generic")
"""The source types `send` signs for (routing.sources.SOURCE_TYPES; tests/test_cli.py holds the two equal)."""


def cmd_tail(args: argparse.Namespace) -> int:
    """Follow new events and todos (cli/tail.py), as the owner, until interrupted."""
    if args.interval <= 0:
        raise CliError("invalid_argument", "--interval is a positive number of seconds")
    owner_token(args.token)  # a missing token is said before anything is polled

    def verb_call(verb: str, body: dict[str, Any]) -> Any:
        return _agent(args, verb, body)

    # Into a pipe each row is one JSON line (its "type" is event or todo), flushed as it comes.
    Tail(verb_call, output.mode(args.output), webhook_id=args.webhook_id, queue=args.queue).run(args.interval)
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    """Print a shell completion script for the whole command tree."""
    print(completion.script(args.shell, build_parser()), end="")
    return 0


def cmd_send(args: argparse.Namespace) -> int:
    """One signed test delivery to a webhook's ingest URL (cli/send.py); prints the HTTP status and the answer."""
    from cli import send
    from routing.signatures import GenericHmac

    body: bytes | None = None
    if args.body is not None and args.body_file is not None:
        raise CliError("invalid_argument", "give --body or --body-file, not both")
    if args.body is not None:
        body = args.body.encode()
    elif args.body_file is not None:
        try:
            body = sys.stdin.buffer.read() if args.body_file == "-" else Path(args.body_file).read_bytes()
        except OSError as exc:
            raise CliError("invalid_argument", f"cannot read {args.body_file}: {exc.strerror or exc}") from None
    hmac = None
    if args.hmac_header is not None:
        hmac = GenericHmac(header=args.hmac_header, format=args.hmac_format)
    raw, headers = send.prepare(
        args.source,
        args.secret or os.environ.get(send.SECRET_ENV),
        body=body,
        event=args.event,
        delivery_id=args.delivery_id,
        headers=args.header,
        hmac=hmac,
    )
    resp = send.send(args.ingest_url or os.environ.get(send.INGEST_URL_ENV, ""), raw, headers)
    # The status first, on its own line on standard error: it is the producer's whole verdict (202 accepted).
    print(f"HTTP {resp.status} {resp.reason}", file=sys.stderr)
    try:
        answer: Any = json.loads(resp.body)
    except ValueError:
        answer = resp.body.decode("utf-8", "replace")
    output.emit(answer, output.mode(args.output))
    return 0 if resp.status < 300 else 1


def _add_argument(parser: argparse.ArgumentParser, arg: dict[str, Any]) -> None:
    options: dict[str, Any] = {"help": arg["help"]}
    if arg["type"] is not None:
        options["type"] = commands.CONVERTERS[arg["type"]]
    if arg["choices"] is not None:
        options["choices"] = list(arg["choices"])
    if arg["metavar"] is not None:
        options["metavar"] = arg["metavar"]
    if arg["switch"]:
        parser.add_argument(
            arg["flag"], dest=arg["field"], action="store_const", const=True, default=None, help=arg["help"]
        )
    elif arg["flag"] is None:
        parser.add_argument(arg["field"], **options)
    else:
        parser.add_argument(arg["flag"], dest=arg["field"], required=arg["required"], default=arg["default"], **options)


def _verb_command(command: dict[str, Any], agent_verbs: list[str]) -> Any:
    """Run one verb command: its arguments as the verb's input, through its completer, to the API; print the answer."""
    fields = [arg["field"] for arg in command["args"]]
    complete = commands.COMPLETERS[command["complete"]] if command["complete"] else None

    def run(args: argparse.Namespace) -> int:
        if command["surface"] == "admin":
            body = {field: getattr(args, field) for field in fields}
        else:
            # An optional argument left unset is left out, so the verb's own default applies.
            body = {field: value for field in fields if (value := getattr(args, field)) is not None}
        if complete is not None:
            try:
                body = complete(body, agent_verbs)
            except argparse.ArgumentTypeError as exc:
                raise CliError("invalid_argument", str(exc)) from None
        send = _admin if command["surface"] == "admin" else _agent
        return _emit(args, send(args, command["verb"], body), command["columns"], command["exports"])

    return run


def client_options(parser: argparse.ArgumentParser, *, top: bool = False, export: bool = False) -> None:
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
    if top or export:
        group.add_argument(
            "--export",
            dest="output",
            action="store_const",
            const="export",
            default=default,
            help='print `export NAME=value` lines for the next command (eval "$(switchboard … --export)");'
            " the answer goes to standard error",
        )


def _choices(verb: str, name: str) -> list[str]:
    """The choices of a verb command's argument, as the verb table describes them (cli/commands.json)."""
    for command in commands.load()["commands"]:
        if command["verb"] == verb:
            for arg in command["args"]:
                if arg["field"] == name:
                    return list(arg["choices"])
    raise LookupError(f"{verb} has no argument {name} with choices")


def add_verb_commands(sub: Any) -> dict[str, Any]:
    """`switchboard GROUP ACTION` for every verb with a command in the verb table (read from cli/commands.json).

    Admin verbs (api/verbs/admin.py) run as the operator; agent verbs as an endpoint (the owner's credential).
    """
    described = commands.load()
    groups: dict[str, Any] = {}
    for command in described["commands"]:
        if command["group"] not in groups:
            groups[command["group"]] = sub.add_parser(command["group"], help=command["group_help"]).add_subparsers(
                dest="action", required=True
            )
        parser = groups[command["group"]].add_parser(
            command["action"], help=command["help"], description=command["help"]
        )
        for arg in command["args"]:
            _add_argument(parser, arg)
        client_options(parser, export=bool(command["exports"]))
        parser.set_defaults(fn=_verb_command(command, described["agent_verbs"]), exports=command["exports"])
    return groups


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"switchboard {_version()}")
        parser.exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("switchboard")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree: service commands, the verb table's commands, the composed ones."""
    p = argparse.ArgumentParser(prog="switchboard", description=__doc__, epilog=EPILOG)
    p.add_argument("--version", action=_VersionAction)
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
    rules = groups["rules"]
    ri = rules.add_parser("install", help="install a rule pack on a webhook (one set_webhook_rules call)")
    ri.add_argument("--webhook", required=True, dest="webhook_id")
    ri.add_argument("--pack", required=True, help=f"{' or '.join(RULE_PACKS)}, or a path to a pack JSON file")
    ri.add_argument("--params-file", default=None, help="JSON object that replaces the pack's placeholder params")
    ri.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="set one param (VALUE as JSON, else text)"
    )
    ri.add_argument(
        "--queue",
        action="append",
        default=None,
        metavar="NAME=QUEUE",
        help="a pack with a queues table (starter): route its queue NAME to QUEUE (default: the table's, work)",
    )
    ri.add_argument("--force", action="store_true", help="install even if a rule faults on recent events (recorded)")
    client_options(ri)
    ri.set_defaults(fn=cmd_rules_install)

    # Composed of two verbs (one event, or a filtered batch) and following the run with get_reroute.
    events = groups["events"]
    er = events.add_parser(
        "reroute",
        help="route stored events again with the webhook's current rules: one EVENT_ID, or --webhook with filters",
    )
    er.add_argument("event_id", nargs="?", default=None, help="reroute_webhook_event: this event")
    er.add_argument("--webhook", dest="webhook_id", default=None, help="reroute_webhook_events: this webhook's")
    er.add_argument("--disposition", choices=_choices("list_webhook_events", "disposition"), default=None)
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

    # A producer's delivery, signed as that producer signs it (cli/send.py).
    sd = sub.add_parser(
        "send",
        help="send a signed test delivery to a webhook's ingest URL, as its producer would; prints the HTTP status",
        description="Signs with the webhook's secret exactly as the source's producer does and POSTs to the ingest"
        " URL. Without --body, a sample of the source's own kind (an opened GitHub issue, a Stripe payment, a Slack"
        " mention, a cairn handoff). Every send is a new delivery unless --delivery-id repeats one.",
    )
    sd.add_argument("source", choices=SEND_SOURCES, help="the webhook's source type")
    sd.add_argument("--body", default=None, help="the JSON body (default: a sample for the source)")
    sd.add_argument("--body-file", default=None, metavar="FILE", help="the body from a file (- for standard input)")
    sd.add_argument("--event", default=None, help="github, gitea: the event header (default: issues)")
    sd.add_argument("--delivery-id", default=None, help="the producer's delivery id (default: a fresh one)")
    sd.add_argument(
        "--header", action="append", default=[], metavar="'NAME: VALUE'", help="one more header (repeatable)"
    )
    sd.add_argument("--ingest-url", default=None, help="where to post (default: $SWITCHBOARD_INGEST_URL)")
    sd.add_argument("--secret", default=None, help="the signing secret (default: $SWITCHBOARD_WEBHOOK_SECRET)")
    sd.add_argument("--hmac-header", default=None, help="generic: the collector's HMAC header, to sign with it")
    sd.add_argument("--hmac-format", default="sha256=hex", choices=("sha256=hex", "hex", "base64"))
    client_options(sd)
    sd.set_defaults(fn=cmd_send)

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
        if getattr(args, "output", None) == "export" and not getattr(args, "exports", None):
            raise CliError("invalid_argument", "--export: this command exports nothing")
        code = int(args.fn(args) or 0)
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
