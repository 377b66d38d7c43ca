"""The routing composition (routing.router): evaluate only when there are rules, then decide."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from routing.decision import decide
from routing.delivery import CommitInput, DeliveryInput
from routing.models import Decision, EvaluateInput, Evaluation, Fault, Grant, Mint, Target
from routing.router import evaluation_input, evaluator, needs_envelope, route

ENVELOPE: dict[str, Any] = {"source": "github", "kind": "issues", "payload": {"issue": {"number": 1}}}


def grant(**overrides: Any) -> Grant:
    """Owner A and route B, target queue work, lane granted."""
    base: dict[str, Any] = {
        "webhook_id": "wh_1",
        "owner_endpoint_id": "ep_a",
        "human_id": "hu_1",
        "source": "github",
        "target_queue": "work",
        "allowed_queues": ["lane"],
        "targets": [Target(endpoint_id="ep_a", scope_queues=["work"]), Target(endpoint_id="ep_b", scope_queues=[])],
    }
    base.update(overrides)
    return Grant(**base)


class Recorder:
    """An evaluate step that records its inputs and answers a fixed evaluation."""

    def __init__(self, answer: Evaluation) -> None:
        self.answer = answer
        self.calls: list[EvaluateInput] = []

    async def __call__(self, request: EvaluateInput) -> Evaluation:
        self.calls.append(request)
        return self.answer


async def test_no_rules_never_evaluates_and_takes_the_default() -> None:
    step = Recorder(Evaluation(matched_index=0))
    routed = await route(grant(), None, step)
    assert step.calls == []
    assert routed.evaluation == Evaluation()
    assert routed.decision == decide(grant(), Evaluation(), None)
    assert [(t.endpoint_id, t.queue) for t in routed.decision.todos] == [("ep_a", "work"), ("ep_b", "work")]


async def test_rules_evaluate_once_on_the_envelope_with_params_then_decide() -> None:
    rules = [{"id": "lane", "expr": "true", "action": {"queue": "lane"}}]
    g = grant(rules=rules, params={"k": 1})
    step = Recorder(Evaluation(matched_index=0))
    routed = await route(g, ENVELOPE, step)
    assert step.calls == [EvaluateInput(rules=rules, params={"k": 1}, envelope=ENVELOPE)]
    assert routed.evaluation == Evaluation(matched_index=0)
    assert routed.decision == decide(g, Evaluation(matched_index=0), ENVELOPE)
    assert routed.decision.trace["rule_id"] == "lane"


async def test_a_faulted_evaluation_reaches_decide_unchanged() -> None:
    rules = [{"id": "gate", "expr": "error", "action": {"drop": True}}]
    fault = Fault(rule_index=0, rule_id="gate", cause="error", detail="boom")
    held = await route(grant(rules=rules, on_fault="hold"), ENVELOPE, Recorder(Evaluation(faults=[fault])))
    assert held.decision.disposition == "faulted" and held.evaluation.faults == [fault]
    went_on = await route(grant(rules=rules), ENVELOPE, Recorder(Evaluation(faults=[fault])))
    assert went_on.decision.disposition == "routed" and went_on.decision.trace["cause"] == "no_match_default"


def test_the_envelope_is_needed_only_for_rules_or_a_configured_default() -> None:
    assert needs_envelope(grant()) is False
    assert needs_envelope(grant(rules=[{"id": "r", "expr": "true", "action": {"queue": "work"}}])) is True
    assert needs_envelope(grant(default_action={"queue": "work", "once": True})) is True
    assert evaluation_input(grant(), None) is None
    with pytest.raises(ValueError, match="envelope"):
        evaluation_input(grant(rules=[{"id": "r", "expr": "true", "action": {"queue": "work"}}]), None)


async def test_a_sandbox_pool_serves_the_evaluate_step() -> None:
    class Pool:
        seen: list[tuple[Any, ...]] = []

        async def evaluate(
            self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
        ) -> Evaluation:
            self.seen.append((rules, params, envelope))
            return Evaluation(matched_index=0)

    pool = Pool()
    rules = [{"id": "r", "expr": "true", "action": {"drop": True}}]
    routed = await route(grant(rules=rules), ENVELOPE, evaluator(pool))
    assert pool.seen == [(rules, None, ENVELOPE)]
    assert routed.decision.disposition == "dropped"


def test_the_router_imports_no_jq() -> None:
    # RouteDelivery imports the router inside the workflow sandbox, which must not need the jq extension.
    code = "import sys, routing.router; sys.exit(1 if 'jq' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- Decision on the wire ----------------------------------------------------------------------------

_DELIVERY = DeliveryInput(
    webhook_id="wh_1",
    endpoint_id="ep_a",
    source="github",
    kind="issues",
    external_id="wh_1:d1",
    trust_mode="signed",
    verified=True,
    verify_detail="ok",
    content_type="application/json",
    headers={},
    body=b"{}",
    source_ip=None,
    received_at="2026-01-01T00:00:00+00:00",
)


def test_a_decision_round_trips_inside_the_commit_input() -> None:
    decision = Decision(disposition="routed", todos=[Mint(endpoint_id="ep_a", queue="work")], trace={})
    commit = CommitInput(delivery=_DELIVERY, decision=decision, workflow_id="delivery-x")
    [payload] = pydantic_data_converter.payload_converter.to_payloads([commit])
    assert json.loads(payload.data)["decision"]["todos"] == [{"endpoint_id": "ep_a", "queue": "work"}]
    [back] = pydantic_data_converter.payload_converter.from_payloads([payload], [CommitInput])
    assert back == commit
