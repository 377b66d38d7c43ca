"""Hostile inputs against the router: deep nesting, trust-field tampering, and random envelopes and rules."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routing.envelope import build_envelope, parse_payload
from routing.sandbox import SandboxPool
from tests.routing.in_process import evaluate_in_process
from tests.routing.jq_reference import decided, reference_evaluate


def _envelope(body: bytes, *, verified: bool = False) -> dict[str, Any]:
    return build_envelope(
        source="generic",
        webhook_id="wh_x",
        trust_mode="token",
        verified=verified,
        content_type="application/json",
        headers={"content-type": "application/json"},
        body=body,
    )


def test_deeply_nested_bodies_become_null_payloads_not_crashes() -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    assert parse_payload(body) is None
    env = _envelope(body)
    assert env["payload"] is None and env["size"] == len(body)


async def test_deep_nesting_and_tampering_rules_cannot_stall_or_change_trust_fields() -> None:
    env = _envelope(b'{"a": 1, "verified": true, "trust_mode": "signed"}')
    before = copy.deepcopy(env)
    deep_expr = "(" * 1500 + "1" + ")" * 1500
    rules = [
        {"id": "tamper", "expr": '.verified = true | .trust_mode = "signed" | false', "action": {"drop": True}},
        {"id": "deep", "expr": deep_expr + " | false", "action": {"drop": True}},
        {"id": "nest-build", "expr": "reduce range(100000) as $i (null; [.]) | false", "action": {"drop": True}},
        {"id": "ok", "expr": ".payload.a == 1 and (.verified | not)", "action": {"queue": "work"}},
    ]
    pool = SandboxPool()
    try:
        started = time.perf_counter()
        result = await pool.evaluate(rules, None, env)
        elapsed = time.perf_counter() - started
    finally:
        await pool.close()
    # The last rule decides: the envelope it saw still says unverified, whatever earlier rules assigned.
    assert result.matched_index == 3, result
    assert elapsed < 2.5
    assert env == before


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=20,
)
EXPRESSIONS = [
    ".payload == null",
    '.payload | type == "object"',
    ".payload | length > 2",
    ".payload.a? // false",
    "[.payload | .. | numbers] | add? // 0 | . > 10",
    'error("boom")',
    '.payload | keys? | index("a")',
    '$params.allow | arrays | any(. == "x")',
    "false",
    "empty",
]
RULE_LISTS = st.lists(st.sampled_from(EXPRESSIONS), min_size=1, max_size=6).map(
    lambda exprs: [{"id": f"r{i}", "expr": e, "action": {"queue": "work"}} for i, e in enumerate(exprs)]
)
PARAMS = st.none() | st.fixed_dictionaries(
    {"allow": st.lists(st.sampled_from(["x", "y"]), max_size=2) | st.text(max_size=3)}
)


@settings(max_examples=150, deadline=None)
@given(payload=JSON, rules=RULE_LISTS, params=PARAMS)
def test_the_engine_agrees_with_libjq_rule_by_rule_for_random_envelopes_and_rules(
    payload: Any, rules: list[dict[str, Any]], params: Any
) -> None:
    import json

    env = _envelope(json.dumps(payload).encode())
    expected = decided(reference_evaluate(rules, params, env))
    assert decided(evaluate_in_process(rules, params, env, rule_timeout=5.0, event_budget=30.0)) == expected
    # The same envelope again: nothing the first evaluation did is remembered into the second.
    assert decided(evaluate_in_process(rules, params, copy.deepcopy(env), rule_timeout=5.0, event_budget=30.0)) == (
        expected
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=JSON, rules=RULE_LISTS, params=PARAMS)
def test_sandbox_children_agree_with_libjq_rule_by_rule(payload: Any, rules: list[dict[str, Any]], params: Any) -> None:
    import json

    env = _envelope(json.dumps(payload).encode())
    expected = decided(reference_evaluate(rules, params, env))

    async def run() -> Any:
        pool = SandboxPool(rule_timeout=5.0, event_budget=30.0, hard_deadline=60.0)
        try:
            return await pool.evaluate(rules, params, env)
        finally:
            await pool.close()

    assert decided(asyncio.run(run())) == expected
