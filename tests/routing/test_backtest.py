"""Pure replay logic (routing.backtest): candidate configuration, stored envelopes, outcomes and the once-key simulation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from routing.backtest import (
    Outcome,
    Replayed,
    StoredEvent,
    StoredTodo,
    backtest,
    candidate_of,
    changed,
    decider,
    simulate_once,
    standing_claims,
    summarize_decision,
)
from routing.delivery import DeliveryInput
from routing.models import Decision, EvaluateInput, Evaluation, Grant, Mint, Target

AT = datetime(2026, 1, 1, tzinfo=UTC)
BODY = json.dumps({"action": "opened", "issue": {"number": 7, "title": "t"}, "repository": {"full_name": "a/b"}})


def grant(**overrides: Any) -> Grant:
    base: dict[str, Any] = {
        "webhook_id": "wh_1",
        "owner_endpoint_id": "ep_a",
        "human_id": "hu_1",
        "source": "github",
        "target_queue": "work",
        "allowed_queues": [],
        "targets": [Target(endpoint_id="ep_a", scope_queues=["work"])],
        "rules": [{"id": "saved", "expr": "true", "action": {"queue": "work"}}],
        "default_action": {"queue": "work"},
        "params": {"p": 1},
        "on_fault": "hold",
    }
    base.update(overrides)
    return Grant(**base)


def event(event_id: str, *, disposition: str = "routed", todo_ids: Sequence[str] = (), **trace: Any) -> StoredEvent:
    return StoredEvent(
        id=event_id,
        webhook_id="wh_1",
        source="github",
        kind="issues",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={"x-github-event": "issues"},
        payload=BODY.encode(),
        payload_size=len(BODY),
        received_at=AT,
        routing_trace={"stage": "default", "cause": "no_match_default", "action": {"queue": "work"}, **trace},
        disposition=disposition,  # type: ignore[arg-type]
        todo_ids=list(todo_ids),
    )


def routed(once_key: str | None = None) -> Decision:
    trace: dict[str, Any] = {"stage": "rule", "rule_id": "r", "action": {"queue": "work", "once": True}}
    if once_key:
        trace["once_key"] = once_key
    return Decision(
        disposition="routed", todos=[Mint(endpoint_id="ep_a", queue="work")], trace=trace, once_key=once_key
    )


def test_nothing_given_replays_the_saved_configuration() -> None:
    assert candidate_of(grant(), {}) is None
    assert candidate_of(grant(), {"webhook_id": "wh_1", "limit": 5}) is None
    # A null rules or on_fault means the saved one, so alone they try nothing new.
    assert candidate_of(grant(), {"rules": None, "on_fault": None}) is None


def test_each_given_field_replaces_the_saved_one_and_null_default_or_params_is_a_value() -> None:
    rules = [{"expr": "false", "action": {"drop": True}}]
    candidate = candidate_of(grant(), {"rules": rules, "default_action": None})
    assert candidate is not None
    assert candidate.rules == rules
    assert candidate.default_action is None
    assert candidate.params == {"p": 1} and candidate.on_fault == "hold"
    only = candidate_of(grant(), {"params": None, "on_fault": "continue"})
    assert only is not None
    assert only.rules == grant().rules and only.params is None and only.on_fault == "continue"


def test_a_stored_event_has_the_envelope_the_receiver_built() -> None:
    stored = event("ev_1")
    delivery = DeliveryInput(
        webhook_id="wh_1",
        endpoint_id="ep_a",
        source="github",
        kind="issues",
        external_id="wh_1:d1",
        trust_mode="signed",
        verified=True,
        verify_detail="ok",
        content_type="application/json",
        headers={"x-github-event": "issues"},
        body=BODY.encode(),
        source_ip=None,
        received_at=AT.isoformat(),
    )
    assert stored.envelope() == delivery.envelope()
    assert stored.envelope()["payload"]["issue"]["number"] == 7


def test_the_dry_run_summary_of_each_disposition() -> None:
    assert summarize_decision(Decision(disposition="dropped", trace={})).drop is True
    assert summarize_decision(Decision(disposition="faulted", trace={})).disposition == "faulted"
    assert summarize_decision(Decision(disposition="routed", trace={})).disposition == "no_targets"
    shown = summarize_decision(routed("k1"))
    assert (shown.disposition, shown.queue, shown.endpoints, shown.once_key) == ("routed", "work", ["ep_a"], "k1")


def test_claims_made_inside_the_window_are_replayed_older_ones_stand() -> None:
    assert standing_claims({"k1": "ev_old", "k2": "ev_2"}, {"ev_1", "ev_2"}) == {"k1"}


def test_once_simulation_makes_later_events_of_a_claimed_key_repeats() -> None:
    replayed = [
        Replayed(event=event(f"ev_{n}"), stored=Outcome(disposition="routed", queue="work"), decision=routed(key))
        for n, key in enumerate(["k1", "k1", "k2", None])
    ]
    rows = simulate_once(replayed, {"k2"})
    assert [r.candidate.disposition for r in rows] == ["routed", "repeat", "repeat", "routed"]
    assert [r.candidate.endpoints for r in rows] == [["ep_a"], [], [], ["ep_a"]]
    assert [r.changed for r in rows] == [True, True, True, True]  # stored had no endpoints on record


def test_changed_compares_what_is_on_record_when_todos_were_pruned() -> None:
    stored = Outcome(disposition="routed", queue="work", endpoints=[], todos_missing=True)
    assert changed(stored, Outcome(disposition="routed", queue="work", endpoints=["ep_a"])) is False
    assert changed(stored, Outcome(disposition="routed", queue="lane", endpoints=["ep_a"])) is True
    whole = Outcome(disposition="routed", queue="work", endpoints=["ep_b", "ep_a"])
    assert changed(whole, Outcome(disposition="routed", queue="work", endpoints=["ep_a", "ep_b"])) is False


def test_decider_names_the_rule_or_the_default_cause() -> None:
    assert decider(Outcome(disposition="routed", stage="rule", rule_id="r1")) == "r1"
    assert decider(Outcome(disposition="routed", stage="default", cause="rule_not_granted", rule_id="r1")) == (
        "default:rule_not_granted:r1"
    )
    assert decider(Outcome(disposition="routed", stage="default", cause="no_match_default")) == (
        "default:no_match_default"
    )


class FakeHistory:
    """A history of three events, newest first ev_3, ev_2, ev_1; ev_1's todo was pruned."""

    def __init__(self) -> None:
        self.events = {
            "ev_1": event("ev_1", todo_ids=["td_gone"]),
            "ev_2": event("ev_2", disposition="dropped", stage="rule", rule_id="gate", action={"drop": True}),
            "ev_3": event("ev_3", todo_ids=["td_3"]),
        }
        self.asked: list[list[str]] = []

    async def recent_event_ids(self, webhook_id: str, limit: int) -> list[str]:
        return ["ev_3", "ev_2", "ev_1"][:limit]

    async def stored_events(self, webhook_id: str, event_ids: Sequence[str]) -> list[StoredEvent]:
        self.asked.append(list(event_ids))
        return [self.events[i] for i in event_ids]

    async def landed_todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        found = {"td_3": StoredTodo(id="td_3", endpoint_id="ep_a", queue="work")}
        return {t: found[t] for t in todo_ids if t in found}

    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        return {}


async def test_backtest_replays_oldest_first_and_answers_newest_first() -> None:
    history = FakeHistory()
    seen: list[int] = []

    async def step(request: EvaluateInput) -> Evaluation:
        assert request.envelope is not None
        seen.append(request.envelope["payload"]["issue"]["number"])
        return Evaluation()

    result = await backtest(history, grant(rules=[{"id": "r", "expr": "false", "action": {"drop": True}}]), 3, step)
    assert history.asked == [["ev_1", "ev_2", "ev_3"]]
    assert len(seen) == 3
    assert [r.event_id for r in result.events] == ["ev_3", "ev_2", "ev_1"]
    assert [r.changed for r in result.events] == [False, True, False]
    assert result.events[2].stored.todos_missing is True
    assert result.summary.transitions == {"dropped→routed": 1}
    assert result.summary.stored_by_decision == {"routed": 2, "dropped": 1}
    # Payloads are released as soon as each event is routed.
    assert all(e.payload == b"" for e in history.events.values())
