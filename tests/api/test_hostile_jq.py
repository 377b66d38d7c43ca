"""A hostile-jq campaign through the real receiver: every program is refused at save or bounded, none reads
the environment, and the service keeps answering (issue 8)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from typing import Any

import pytest

from routing.sandbox import SandboxPool
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github

SECRET_NAME = "SWITCHBOARD_HOSTILE_SECRET"
SECRET = "hostile-s3cr3t-" + uuid.uuid4().hex
HARD_DEADLINE = 2.0
ROUTING_CODES = {"invalid_expression", "forbidden_function", "invalid_rule"}

# Programs that run away in time or memory: refused at save, or killed/faulted and decided by the default.
BOMBS = [
    "def f: f; f",
    "def f(x): f(x + 1); f(0)",
    "def f: [f]; f",
    "def f: def g: f; g; f",
    "[repeat(1)] | length",
    "[range(1e9)] | length",
    "last(range(1e12))",
    "reduce range(1e15) as $i (0; . + 1) > 0",
    "[foreach range(1e15) as $i (0; . + 1)] | length",
    "0 | until(. < 0; . + 1)",
    "until(false; [.])",
    "0 | [recurse(. + 1; true)] | length",
    "0 | first(recurse(. + 1) | select(. < 0))",
    "first(range(1e15) | select(. < 0))",
    "first(repeat(1) | select(. == 2))",
    "any(repeat(true); not)",
    "all(range(1e15); . >= 0) | not",
    "[range(0; 1; 1e-15)] | length",
    "[range(1e15) as $x | empty] | length",
    "label $out | repeat(1) | select(false)",
    '[limit(1e9; repeat("x"))] | length',
    '[limit(1e8; repeat("x" * 1000))] | length',
    "limit(1e18; repeat(1)) | select(false)",
    "limit(-1; repeat(1))",
    'reduce range(40) as $i ("x"; . + .) | length > 0',
    '"x" * .payload.issue.number * 1e9 | length > 0',
    "reduce range(30) as $i ([1]; . + .) | length",
    "reduce range(30) as $i ([1]; [., .]) | tojson | length",
    "[range(1e7)] | tostring | length",
    "[range(1e7)] | [tostream] | length",
    "[range(1e7) | 65] | implode | length",
    '("QUFB" * (.payload.issue.number * 1e8)) | @base64d | length',
    "(.payload | tostring) * 100000 | @base64d | @base64 | length",
    "reduce range(100000) as $i (null; [.]) | [paths] | length",
    "reduce range(1000000) as $i ([]; [.]) | [..] | length",
    "reduce range(100000) as $i (null; {a: .}) | walk(.) | tostring | length",
    '("a" * 1e7) | [splits("")] | length',
    '(("a" * 40) + "!") | test("^(a+)+$")',
    "[range(10) | [range(30)]] | [combinations] | length",
    "[range(1e8)] | sort | length",
    '("x" * (1e8 * .payload.issue.number)) | @sh | length',
    'reduce range(60) as $i ("x"; @base64) | length',
    '[range(1e6) | tostring] | join(",") | ascii_downcase * 1000 | length',
    '"x" * 200000000 | length > 0',  # folded at compile time, so libjq allocates it while compiling
]

# Disguises of what reads outside the envelope. Each must be refused at save; one that is accepted must
# still read nothing (the child refuses it, or its environment is empty) and stay bounded.
_S = SECRET_NAME
DISGUISES = [
    f"env.{_S} != null",
    f"$ENV.{_S} != null",
    "env | length > 0",
    "$ENV | keys | length > 0",
    f"{{env}} | .env.{_S} != null",
    f"{{$ENV}} | .ENV.{_S} != null",
    "{a: 1, env} | .a == 1",
    "{a: 1, now} | .a == 1",
    "{env} | .env == null",
    f'"\\(env)" | contains("{SECRET[:12]}")',
    f'"\\("\\(env)")" | contains("{SECRET[:12]}")',
    f'@sh "\\(env)" | contains("{SECRET[:12]}")',
    f'@json "\\($ENV)" | contains("{SECRET[:12]}")',
    '@base64 "\\(input)" | length > 0',
    '@text "\\(now)" | length > 0',
    f"# a comment first\nenv.{_S} != null",
    f"true # a comment ending in a backslash \\\n and (env.{_S} != null)",
    f"(env.{_S} != null) # \\\n",
    f". as $__tmp | $ENV.{_S} != null",
    ". as $__tmp | true",
    "$__loc__ | tostring | length > 0",
    "{$__loc__} | length > 0",
    "$__prog_args | length > 0",
    "input | length > 0",
    "[inputs] | length >= 0",
    "first(inputs) | true",
    "input_filename | true",
    "input_line_number | true",
    'import "a" as a; true',
    'include "a"; true',
    'import "a" as $a; true',
    "halt",
    "halt_error",
    '"x" | halt_error(1)',
    "now > 0",
    "debug | true",
    'debug("x") | true',
    "stderr | true",
    "get_search_list | true",
    "get_prog_origin | true",
    "get_jq_origin | true",
    "modulemeta | true",
    "localtime | true",
    'strflocaltime("%c") | true',
    f"..|env|.{_S}? != null",
    "def e: env; e | length > 0",
    f"if true then env.{_S} != null else false end",
    "try env catch false | length > 0",
    "reduce env as $e (0; 1) > 0",
    "[.[]?, env] | length > 1",
    f'{{(env | tostring): 1}} | keys[0] | contains("{SECRET[:12]}")',
    f'getpath(["a"]) as $x | env.{_S} != null',
    f'"a" as $x | "\\($x)\\(env)" | contains("{SECRET[:12]}")',
    f'ltrimstr(env | tostring) | tostring | contains("{SECRET[:12]}")',
    "error(env | tostring)",
    "error($ENV | tostring)",
]
# Disguises that are in fact harmless syntax (jq_policy accepts them): object key shorthand indexes the
# envelope (`{env}` is `{env: .env}`) and a backslash continues a comment, so they match on envelope data alone.
HARMLESS = {
    "{a: 1, env} | .a == 1",
    "{a: 1, now} | .a == 1",
    "{env} | .env == null",
    f"true # a comment ending in a backslash \\\n and (env.{_S} != null)",
}


def _vm_hwm_kib(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return 0


async def _watch_children(pool: SandboxPool, peak: list[int], stop: asyncio.Event) -> None:
    """Sample the children's peak RSS while they live (killed children take their figures with them)."""
    while not stop.is_set():
        for pid in pool.child_pids():
            peak[0] = max(peak[0], _vm_hwm_kib(pid))
        await asyncio.sleep(0.01)


async def test_hostile_jq_is_refused_at_save_or_bounded_and_never_reads_the_environment(
    stack: Stack, sandbox: SandboxPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_NAME, SECRET)
    assert os.environ[SECRET_NAME] == SECRET
    agent = await stack.agent(queues=["work"], webhook_queues=["work", "leak"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = webhook["webhook_id"]
    number = iter(range(1, 10**6))

    async def deliver() -> tuple[dict[str, Any], dict[str, Any], float, str]:
        started = time.perf_counter()
        resp = await post_github(stack.http, webhook, issue_payload(number=next(number)))
        took = time.perf_counter() - started
        assert resp.status_code == 202, resp.text
        body: dict[str, Any] = resp.json()
        [(trace,)] = stack.sql("SELECT routing_trace FROM events WHERE id = %s", body["event_id"])
        return body, trace, took, resp.text

    async def baseline() -> float:
        """A cheap rule that never matches, so the default decides as it does for a faulted rule."""
        plain = [{"id": "plain", "expr": "false", "action": {"queue": "leak"}}]
        await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": plain, "default_action": {"queue": "work"}})
        return (await deliver())[2]

    for _ in range(3):  # warm: compiled lists, connections, the worker's caches
        await baseline()

    worker_before = _vm_hwm_kib("self")
    child_peak = [0]
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_children(sandbox, child_peak, stop))
    refused: list[str] = []
    bounded: list[tuple[str, float, list[str]]] = []
    added: list[float] = []  # a bomb's delivery minus the plain delivery right after it (paired, same load)
    worker_growth: list[tuple[int, str]] = []
    accepted_disguises: list[tuple[str, list[str]]] = []
    save_seconds: list[tuple[float, str]] = []
    try:
        for kind, program in [("bomb", p) for p in BOMBS] + [("disguise", p) for p in DISGUISES]:
            hwm = _vm_hwm_kib("self")
            started = time.perf_counter()
            saved = await agent.call(
                "set_webhook_rules",
                {
                    "webhook_id": wid,
                    "rules": [{"id": "hostile", "expr": program, "action": {"queue": "leak"}}],
                    "default_action": {"queue": "work"},
                    # Saved even when it faults on the events stored so far (rule_faults_on_recent_events): what
                    # is tested here is how a delivery bounds a hostile rule that is in force.
                    "force": True,
                },
            )
            save_seconds.append((time.perf_counter() - started, program))
            worker_growth.append((_vm_hwm_kib("self") - hwm, program))
            assert SECRET not in saved.text, program
            if saved.status_code == 422:
                assert saved.json()["error"]["code"] in ROUTING_CODES, (program, saved.text)
                refused.append(program)
                continue
            assert saved.status_code == 200, (program, saved.text)
            body, trace, took, text = await deliver()
            causes = [f["cause"] for f in trace.get("faults", [])]
            # Decided, by the default, and never by a rule that saw the secret (harmless syntax may match).
            expected = "leak" if program in HARMLESS else "work"
            assert trace["action"] == {"queue": expected}, (program, trace)
            assert body["created"] == 1 and body["todos"][0]["queue"] == expected, (program, body)
            assert SECRET not in text and SECRET not in json.dumps(trace), program
            assert took < HARD_DEADLINE + 3.0, (program, took)  # the hard deadline, and the stack's own time
            if kind == "bomb":
                assert causes, (program, trace)  # a runaway is a visible fault, never a silent no-match
                bounded.append((program, took, causes))
                added.append(took - await baseline())
            else:
                accepted_disguises.append((program, causes))
    finally:
        stop.set()
        await watcher
    worker_after = _vm_hwm_kib("self")

    # The service keeps answering: a plain rule routes, and the health check is ok.
    await agent.ok(
        "set_webhook_rules",
        {"webhook_id": wid, "rules": [{"id": "plain", "expr": ".verified", "action": {"queue": "leak"}}]},
    )
    body, trace, _, _ = await deliver()
    assert trace["rule_id"] == "plain" and "faults" not in trace and body["todos"][0]["queue"] == "leak"
    assert (await stack.http.get("/healthz")).status_code == 200

    assert len(BOMBS) + len(DISGUISES) >= 50
    added.sort()
    print(f"\nhostile jq: {len(BOMBS)} bombs, {len(DISGUISES)} disguises; {len(refused)} refused at save")
    if added:
        print(
            f"bounded bombs: {len(bounded)}; added latency p50 {added[len(added) // 2] * 1000:.0f} ms, "
            f"max {added[-1] * 1000:.0f} ms"
        )
        for program, took, causes in bounded:
            print(f"  {took * 1000:7.0f} ms  {causes}  {program!r}")
    slowest_save = max(save_seconds)
    print(f"slowest save: {slowest_save[0] * 1000:.0f} ms for {slowest_save[1]!r}")
    print(f"worker process (API + worker + sandbox parent) VmHWM: {worker_before} KiB before, {worker_after} after")
    growth, grower = max(worker_growth)
    print(f"  largest growth at one save: {growth} KiB, {grower!r} (save-time compiles run in the rule sandbox)")
    print(f"sandbox children peak VmHWM sampled: {child_peak[0]} KiB")
    print(f"disguises accepted at save (the save-time policy's to refuse): {len(accepted_disguises)}")
    for program, causes in accepted_disguises:
        print(f"  {causes}  {program!r}")
