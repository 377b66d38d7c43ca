"""Save-time compiles run in the rule sandbox's capped child, never in the API process (issue 8).

libjq folds constants while compiling: a rule like ``"x" * 2e8 | length > 0`` allocates its string before it
ever runs, and an allocation libjq cannot get aborts the whole process.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.conftest import Stack
from tests.helpers import eventually, issue_payload, post_github

COMPILE_LIMIT = "compiling exceeds the sandbox's memory or time limit"
PLAIN = {"id": "plain", "expr": ".verified", "action": {"queue": "work"}}
FOLDS_50_MB = '"x" * 50000000 | length > 0'  # fits the child's 128 MiB cap: accepted
FOLDS_200_MB = '"x" * 200000000 | length > 0'  # does not: refused
FOLDS_1_GB = '"x" * 1e9 | length > 0'
GROWTH_KIB = 8 * 1024  # a few MB of slack for the stack's own work; a folded string here would be 50 MB+


def vm_hwm_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def big(expr: str) -> dict[str, Any]:
    return {"id": "big", "name": "the bomb", "expr": expr, "action": {"queue": "work"}}


async def test_saving_a_folded_constant_costs_the_api_process_nothing(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    wid = (await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"}))["webhook_id"]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN]})  # warm: the sandbox's children

    for expr, accepted in ((FOLDS_50_MB, True), (FOLDS_200_MB, False)):
        before = vm_hwm_kib()
        started = time.perf_counter()
        resp = await agent.call("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN, big(expr)]})
        took = time.perf_counter() - started
        growth = vm_hwm_kib() - before
        print(f"\nsave {expr!r}: {resp.status_code} in {took * 1000:.0f} ms; API process VmHWM +{growth} KiB")
        assert growth < GROWTH_KIB, (expr, growth)
        assert took < 5.0, (expr, took)  # the sandbox's 2 s hard deadline bounds the compile
        if accepted:
            assert resp.status_code == 200, resp.text
        else:
            assert resp.status_code == 422, resp.text
            assert resp.json()["error"]["code"] == "invalid_expression"


async def test_a_compile_past_the_childs_cap_is_refused_by_every_validating_verb(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    wid = webhook["webhook_id"]
    saved = await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN]})

    def refused(resp: Any, index: int = 1) -> None:
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["code"] == "invalid_expression", error
        assert error["message"] == f'rule index {index} (id "big", name "the bomb"): {COMPILE_LIMIT}', error

    refused(await agent.call("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN, big(FOLDS_1_GB)]}))
    refused(await agent.call("add_webhook_rule", {"webhook_id": wid, "rule": big(FOLDS_1_GB)}))
    refused(await agent.call("add_webhook_rule", {"webhook_id": wid, "rule": big(FOLDS_1_GB), "position": 0}), 0)
    await agent.ok("add_webhook_rule", {"webhook_id": wid, "rule": {**big("false")}})
    update = {"webhook_id": wid, "rule_id": "big", "rule": {"expr": FOLDS_1_GB}}
    refused(await agent.call("update_webhook_rule", update))
    candidate = {"rules": [PLAIN, big(FOLDS_1_GB)]}
    refused(await agent.call("test_webhook_rules", {"webhook_id": wid, "payload": {}, **candidate}))
    refused(await agent.call("backtest_webhook_rules", {"webhook_id": wid, **candidate}))

    # Nothing changed, and the server keeps answering and routing.
    listed = await agent.ok("list_webhook_rules", {"webhook_id": wid})
    assert [r["id"] for r in listed["rules"]] == [r["id"] for r in saved["rules"]] + ["big"]
    assert listed["rules"][1]["expr"] == "false"

    # /healthz answers within 0.8 s by design; on two busy cores one check may miss that and the next answer.
    async def healthy() -> bool:
        return (await stack.http.get("/healthz")).status_code == 200

    await eventually(healthy, timeout=15)
    resp = await post_github(stack.http, webhook, issue_payload())
    assert resp.status_code == 202, resp.text
    moved = await agent.ok("move_webhook_rule", {"webhook_id": wid, "rule_id": "big", "position": 0})
    assert [r["id"] for r in moved["rules"]] == ["big", "plain"]


async def test_a_stored_rule_that_no_longer_compiles_blocks_a_move_until_fixed(stack: Stack) -> None:
    """A list saved before this check (written here straight to the row) is re-validated by every verb."""
    agent = await stack.agent(queues=["work"])
    wid = (await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"}))["webhook_id"]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN]})
    stored = json.dumps([PLAIN, big(FOLDS_1_GB)])
    stack.sql("UPDATE endpoint_webhooks SET routing_rules = %s::jsonb WHERE id = %s", stored, wid)
    resp = await agent.call("move_webhook_rule", {"webhook_id": wid, "rule_id": "big", "position": 0})
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["message"] == f'rule index 0 (id "big", name "the bomb"): {COMPILE_LIMIT}'
    fixed = await agent.ok("update_webhook_rule", {"webhook_id": wid, "rule_id": "big", "rule": {"expr": "true"}})
    assert [r["expr"] for r in fixed["rules"]] == [".verified", "true"]


async def test_a_sandbox_that_cannot_check_answers_sandbox_busy_and_saves_nothing(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    wid = (await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"}))["webhook_id"]
    await agent.ok("set_webhook_rules", {"webhook_id": wid, "rules": [PLAIN]})
    await stack.app.state.services.rule_sandbox.close()  # as at shutdown: nothing can compile-check now

    for verb, body in (
        ("set_webhook_rules", {"rules": [PLAIN, big("true")]}),
        ("add_webhook_rule", {"rule": big("true")}),
        ("test_webhook_rules", {"payload": {}, "rules": [big("true")]}),
    ):
        resp = await agent.call(verb, {"webhook_id": wid, **body})
        assert resp.status_code == 503, (verb, resp.text)
        assert resp.json()["error"]["code"] == "sandbox_busy", verb
        assert "could not be compile-checked" in resp.json()["error"]["message"], verb
    assert [r["id"] for r in (await agent.ok("list_webhook_rules", {"webhook_id": wid}))["rules"]] == ["plain"]
    # A list with nothing to compile (removing the last rule) needs no sandbox.
    cleared = await agent.ok("remove_webhook_rule", {"webhook_id": wid, "rule_id": "plain"})
    assert cleared["rules"] == []
