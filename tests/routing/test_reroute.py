"""Pure re-route logic (routing.reroute): the re-route's input, and the plan against each delivery's current outcome."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from routing.backtest import Outcome, StoredEvent, StoredTodo
from routing.envelope import once_key, subject_key
from routing.models import EvaluateInput, Evaluation
from routing.reroute import REROUTE_MARK, StoredDelivery, holds_its_work_order, plan, reroute_input
from tests.routing.test_backtest import BODY, event, grant

AT = datetime(2026, 1, 1, tzinfo=UTC)
# The once-key every test event's issue (github:a/b#7) has on queue work.
KEY = once_key(subject_key(event("ev_x").envelope()), "work")


def stored() -> StoredDelivery:
    return StoredDelivery(
        id="ev_orig",
        webhook_id="wh_1",
        endpoint_id="ep_a",
        source="stripe",
        kind="invoice.paid",
        external_id="wh_1:evt_1",
        trust_mode="signed",
        verified=True,
        verify_detail=None,
        content_type="application/json",
        headers={"stripe-signature": "«redacted»"},
        payload=BODY.encode(),
        source_ip="203.0.113.9",
        received_at=AT,
    )


def test_a_reroute_input_is_the_delivery_as_received_with_a_slot_of_its_own() -> None:
    d = reroute_input(stored(), "n1", evaluate_queue_seconds=7.0)
    assert d.reroute_of == "ev_orig" and d.external_id == f"wh_1:evt_1{REROUTE_MARK}n1"
    # Its todos keep the delivery's own key: one live todo per delivery and endpoint.
    assert d.todo_key() == "wh_1:evt_1" and d.idempotency_key == "wh_1:evt_1"
    assert d.body == BODY.encode() and d.headers == {"stripe-signature": "«redacted»"}
    # The stored verdict stands (a Stripe replay window would refuse any later re-check).
    assert (d.trust_mode, d.verified, d.verify_detail) == ("signed", True, "")
    assert datetime.fromisoformat(d.received_at) == AT and d.source_ip == "203.0.113.9"
    assert d.evaluate_queue_seconds == 7.0
    assert d.envelope()["kind"] == "invoice.paid"
    # Another nonce is another slot; an ordinary delivery's todo key is its external id.
    assert reroute_input(stored(), "n2", evaluate_queue_seconds=1).external_id.endswith("n2")
    assert d.model_copy(update={"idempotency_key": None, "reroute_of": None}).todo_key() == d.external_id


def test_a_delivery_that_already_holds_its_work_order_is_not_changed_by_a_repeat() -> None:
    routed = Outcome(disposition="routed", once_key="once:k", queue="lane", endpoints=["ep_a"])
    repeat = Outcome(disposition="repeat", once_key="once:k", queue="lane")
    assert holds_its_work_order(routed, repeat)
    assert not holds_its_work_order(routed, repeat.model_copy(update={"once_key": "once:other"}))
    assert not holds_its_work_order(Outcome(disposition="dropped"), repeat)
    assert not holds_its_work_order(routed, routed)


class History:
    """ev_1 (dropped) was re-routed as ev_1r (routed); ev_2 claimed a once-key; ev_3 was dropped."""

    def __init__(self) -> None:
        self.events: dict[str, StoredEvent] = {
            "ev_1r": event("ev_1r", todo_ids=["td_1"], stage="default", action={"queue": "work"}),
            "ev_2": event("ev_2", todo_ids=["td_2"], stage="rule", rule_id="lane", once_key=KEY),
            "ev_3": event("ev_3", disposition="dropped", stage="rule", rule_id="gate", action={"drop": True}),
        }
        assert KEY is not None
        self.claimed = {KEY: "ev_2"}

    async def recent_event_ids(self, webhook_id: str, limit: int) -> list[str]:
        raise AssertionError("a re-route plans the selected deliveries, not the most recent events")

    async def stored_events(self, webhook_id: str, event_ids: Sequence[str]) -> list[StoredEvent]:
        return [self.events[i] for i in event_ids]

    async def landed_todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        return {t: StoredTodo(id=t, endpoint_id="ep_a", queue="work") for t in todo_ids}

    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        return {k: v for k, v in self.claimed.items() if k in keys}


async def test_the_plan_compares_each_deliverys_current_outcome_and_holds_every_claim() -> None:
    history = History()

    async def step(request: EvaluateInput) -> Evaluation:
        # The webhook's current rules: a once lane for ev_2's issue, nothing for the others.
        assert request.envelope is not None
        return Evaluation(matched_index=0) if request.envelope["payload"] else Evaluation()

    once = grant(rules=[{"id": "lane", "expr": "true", "action": {"queue": "work", "once": True}}], on_fault="continue")
    selected = [("ev_3", "ev_3"), ("ev_2", "ev_2"), ("ev_1", "ev_1r")]
    rows = await plan(history, once, selected, step)
    assert [(r.event_id, r.current_event_id) for r in rows] == selected  # newest first, as selected
    by_id = {r.event_id: r for r in rows}
    # ev_1's current outcome is its re-route's.
    assert by_id["ev_1"].stored.disposition == "routed"
    # The lane claims one key for the issue every event is about: ev_2 holds it already (its own work order,
    # not a change); the others would repeat it.
    assert by_id["ev_2"].candidate.disposition == "repeat" and by_id["ev_2"].changed is False
    assert by_id["ev_3"].candidate.disposition == "repeat" and by_id["ev_3"].changed is True
    assert by_id["ev_1"].candidate.disposition == "repeat" and by_id["ev_1"].changed is True
