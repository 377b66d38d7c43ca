"""A bulk re-route whose worker is killed mid-way: real processes (tests/faults/), each event re-routed once.

`switchboard api` and `switchboard worker` run as their own OS processes against embedded PostgreSQL and the
Temporal dev server; the worker hosts RerouteEvents and every RouteDelivery child. It is SIGKILLed twice while
the re-route runs and started again; the re-route resumes from its history and ends with one new event and one
todo per dropped delivery, never two.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.faults import FaultStack, fault_stack, issue_body
from tests.signing import sign_github

pytestmark = pytest.mark.slow

DELIVERIES = 24
DROP_ALL = {"id": "mute", "expr": "true", "action": {"drop": True}}


@pytest.fixture(scope="module")
def procs() -> Iterator[FaultStack]:
    # A commit delay in the worker (SWITCHBOARD_FAULT_COMMIT_DELAY) keeps each re-route in flight long enough
    # for the kills to land mid-way.
    with fault_stack(apis=1, workers=1, commit_delay=0.3) as stack:
        yield stack


class Owner:
    """An endpoint with every agent verb and one GitHub webhook, over the API process's real HTTP port."""

    def __init__(self, stack: FaultStack) -> None:
        from api.verbs import REGISTRY

        self.base = stack.base(stack.apis[0])
        human = stack.admin("create_human", {"name": "rerouter"})["human_id"]
        agent = stack.admin("create_agent", {"human_id": human, "name": "rerouter"})["agent_id"]
        endpoint = stack.admin(
            "vend_endpoint",
            {
                "agent_id": agent,
                "queues": ["work"],
                "verbs": list(REGISTRY),
                "webhook_max": 5,
                "webhook_source_types": ["github"],
                "webhook_queues": ["work"],
            },
        )
        self.credential = endpoint["credential"]
        self.webhook = self.ok("create_webhook", {"source_type": "github", "target_queue": "work"})

    def ok(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = httpx.post(
            f"{self.base}/v1/{verb}", json=body, headers={"Authorization": f"Bearer {self.credential}"}, timeout=90
        )
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    def deliver(self, n: int) -> str:
        delivery = f"crash-{n}-{uuid.uuid4().hex[:8]}"
        body = issue_body(n, delivery)
        headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery, "Content-Type": "application/json"}
        headers.update(sign_github(self.webhook["secret"].encode(), body))
        token = self.webhook["ingest_url"].rsplit("/", 1)[-1]
        resp = httpx.post(f"{self.base}/webhooks/w/{token}", content=body, headers=headers, timeout=60)
        assert resp.status_code == 202, resp.text
        assert resp.json().get("dropped") is True, resp.text
        return str(resp.json()["event_id"])


def _wait(ok: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_worker_killed_during_a_bulk_reroute_still_reroutes_each_event_exactly_once(procs: FaultStack) -> None:
    stack = procs
    owner = Owner(stack)
    wid = owner.webhook["webhook_id"]
    owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": [DROP_ALL]})
    originals = [owner.deliver(n) for n in range(DELIVERIES)]
    owner.ok("set_webhook_rules", {"webhook_id": wid, "rules": []})

    started = owner.ok("reroute_webhook_events", {"webhook_id": wid, "limit": 200, "wait_seconds": 0})
    assert started["status"] == "running" and started["changed"] == DELIVERIES
    workflow_id = started["workflow_id"]

    def rerouted() -> int:
        return stack.count("SELECT count(*) FROM events WHERE webhook_id = %s AND reroute_of IS NOT NULL", wid)

    worker = stack.workers[0]
    kills = []
    for threshold in (3, 10):
        # Mid-way: some deliveries re-routed, most not yet.
        _wait(lambda t=threshold: rerouted() >= t, 120, f"the re-route did not reach {threshold} events")
        assert rerouted() < DELIVERIES
        worker.kill()
        kills.append(rerouted())
        stack.start_worker(worker)

    done = _wait(
        lambda: (got := owner.ok("get_reroute", {"workflow_id": workflow_id}))["status"] == "completed" and got,
        240,
        "the re-route did not complete after the worker came back",
    )
    progress = done["progress"]
    print(f"\nkilled the worker at {kills} of {DELIVERIES} re-routed; {progress['done']} done")

    # Exactly once: one new event per original, one todo per delivery, nothing failed or doubled.
    per_original = dict(
        stack.sql(
            "SELECT reroute_of, count(*) FROM events WHERE webhook_id = %s AND reroute_of IS NOT NULL GROUP BY 1", wid
        )
    )
    assert per_original == {o: 1 for o in originals}
    assert stack.count("SELECT count(*) FROM events WHERE webhook_id = %s", wid) == 2 * DELIVERIES
    todos = stack.sql(
        "SELECT t.idempotency_key, count(*) FROM todos t JOIN events e ON e.id = t.event_id"
        " WHERE e.webhook_id = %s GROUP BY 1",
        wid,
    )
    assert len(todos) == DELIVERIES and all(n == 1 for _, n in todos)
    assert (progress["done"], progress["created"], progress["failed"]) == (DELIVERIES, DELIVERIES, 0)
    assert sorted(r["event_id"] for r in progress["results"]) == sorted(originals)
    assert all(r["status"] == "committed" and r["created"] == 1 for r in progress["results"])
    # The originals never changed.
    dropped = stack.count(
        "SELECT count(*) FROM events WHERE webhook_id = %s AND reroute_of IS NULL AND disposition = 'dropped'", wid
    )
    assert dropped == DELIVERIES
