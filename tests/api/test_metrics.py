"""GET /metrics on the real stack: the named series exist and move when deliveries land, claims and reaps run."""

from __future__ import annotations

import asyncio
import uuid

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from api.doorbell import DoorbellHub, Ring
from routing.sandbox import SandboxPool
from switchboard.metrics import sandbox_observer
from tests.api.test_todos import reap, seed_todos
from tests.conftest import Stack
from tests.helpers import eventually, issue_payload, post_github

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Every application series the docs and the alert rules name (their families are listed even before a sample).
NAMED = [
    "switchboard_build_info",
    "switchboard_ingest_requests",
    "switchboard_ingest_duration_seconds",
    "switchboard_deliveries",
    "switchboard_rule_faults",
    "switchboard_sandbox_kills",
    "switchboard_sandbox_busy",
    "switchboard_evaluations",
    "switchboard_claims",
    "switchboard_lease_expiries",
    "switchboard_dead_letters",
    "switchboard_doorbell_rings",
    "switchboard_doorbell_drops",
    "switchboard_metrics_database_up",
    "switchboard_inbox_depth",
    "switchboard_inbox_due",
    "switchboard_inbox_oldest_age_seconds",
    "switchboard_inbox_lag_seconds",
    "switchboard_todos",
    "switchboard_reconcile_runs",
    "switchboard_reconcile_deliveries",
    "switchboard_reconcile_api_calls",
]


async def scrape(stack: Stack) -> tuple[set[str], Samples]:
    resp = await stack.http.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    families: set[str] = set()
    samples: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def fresh_database_gauges(stack: Stack) -> None:
    # The gauges are cached for 5 s per app; a test that wants the next read now drops the cache.
    found = getattr(stack.app.state, "metrics_database", None)
    if found is not None:
        found[0].ttl = 0.0


async def test_metrics_name_every_series_and_move_when_a_delivery_lands(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    families, before = await scrape(stack)
    assert set(NAMED) <= families, sorted(set(NAMED) - families)
    assert value(before, "switchboard_build_info", version="0.1.0") == 1
    assert value(before, "switchboard_metrics_database_up") == 1
    assert value(before, "switchboard_inbox_depth") == 0
    assert value(before, "switchboard_todos", queue="work", state="pending") == 0

    resp = await post_github(stack.http, webhook, issue_payload(), delivery="m-1")
    assert resp.status_code == 202 and resp.json()["created"] == 1
    wrong = await post_github(stack.http, webhook, issue_payload(), secret="whsec_" + "0" * 64)
    assert wrong.status_code == 401
    unknown = await stack.http.post("/webhooks/w/" + "0" * 32, content=b"{}")
    assert unknown.status_code == 404
    again = await post_github(stack.http, webhook, issue_payload(), delivery="m-1")
    assert again.json()["duplicate"] is True

    fresh_database_gauges(stack)
    _, after = await scrape(stack)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("switchboard_ingest_requests_total", source="github", status="202") == 2
    assert moved("switchboard_ingest_requests_total", source="github", status="401") == 1
    assert moved("switchboard_ingest_requests_total", source="unknown", status="404") == 1
    assert moved("switchboard_ingest_duration_seconds_count", source="github") == 3
    assert moved("switchboard_ingest_duration_seconds_bucket", source="github", le="+Inf") == 3
    assert moved("switchboard_deliveries_total", source="github", decision="routed") == 1
    assert moved("switchboard_deliveries_total", source="github", decision="duplicate") == 1
    assert value(after, "switchboard_todos", queue="work", state="pending") == 1

    claimed = await agent.ok("claim_next", {})
    assert claimed["todo"]["queue"] == "work"
    fresh_database_gauges(stack)
    _, claimed_now = await scrape(stack)
    assert (
        value(claimed_now, "switchboard_claims_total", queue="work")
        - value(before, "switchboard_claims_total", queue="work")
        == 1
    )
    assert value(claimed_now, "switchboard_todos", queue="work", state="claimed") == 1
    assert value(claimed_now, "switchboard_todos", queue="work", state="pending") == 0


async def test_database_gauges_are_cached_and_fail_soft(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    _, first = await scrape(stack)
    assert value(first, "switchboard_todos", queue="work", state="pending") == 0
    seed_todos(stack, agent.endpoint_id, 3)
    # Within the cache's 5 s the scrape does not query again.
    _, cached = await scrape(stack)
    assert value(cached, "switchboard_todos", queue="work", state="pending") == 0
    fresh_database_gauges(stack)
    _, fresh = await scrape(stack)
    assert value(fresh, "switchboard_todos", queue="work", state="pending") == 3
    # An inbox row shows as depth; a database that cannot answer leaves the gauges out, never a stale value.
    gauges = stack.app.state.metrics_database[0]

    async def broken() -> None:
        raise OSError("connection refused")

    gauges._fetch = broken
    families, down = await scrape(stack)
    assert value(down, "switchboard_metrics_database_up") == 0
    assert ("switchboard_todos", (("queue", "work"), ("state", "pending"))) not in down
    assert "switchboard_ingest_requests" in families  # the process counters still answer


async def test_rule_faults_are_counted_by_cause_when_the_delivery_commits(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rules = [{"id": "boom", "expr": ".issue.number | ascii_downcase", "action": {"drop": True}}]
    await agent.ok("set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": rules})
    _, before = await scrape(stack)
    resp = await post_github(stack.http, webhook, issue_payload())
    assert resp.status_code == 202 and resp.json()["created"] == 1  # "continue": the fault is a no-match
    _, after = await scrape(stack)
    assert (
        value(after, "switchboard_rule_faults_total", cause="error")
        - value(before, "switchboard_rule_faults_total", cause="error")
        == 1
    )


async def test_lease_expiries_and_dead_letters_are_counted(stack: Stack) -> None:
    agent = await stack.agent(queues=["work"])
    expiring, capped, failing = seed_todos(stack, agent.endpoint_id, 3)
    for todo_id in (expiring, capped, failing):
        await agent.ok("claim", {"todo_id": todo_id})
    stack.sql("UPDATE todos SET lease_expires_at = now() - interval '1 second' WHERE id IN (%s, %s)", expiring, capped)
    stack.sql("UPDATE todos SET max_attempts = 1 WHERE id IN (%s, %s)", capped, failing)
    _, before = await scrape(stack)
    failed = await agent.ok("fail", {"todo_id": failing, "error": "gave up"})
    assert failed["todo"]["state"] == "failed" and failed["todo"]["next_retry_at"] is None
    counts = await reap(stack)
    assert counts["requeued"] == 1 and counts["dead_lettered"] == 1
    _, after = await scrape(stack)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("switchboard_lease_expiries_total") == 2
    assert moved("switchboard_dead_letters_total", cause="lease_expired") == 1
    assert moved("switchboard_dead_letters_total", cause="failed") == 1


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_sandbox_kills_and_busy_slots_are_counted() -> None:
    envelope = {"source": "github", "kind": "issues", "payload": {}}
    runaway = [{"expr": "def f: f; f", "action": {"drop": True}}]
    kills = sample("switchboard_sandbox_kills_total", pool="delivery", reason="timeout")
    busy = sample("switchboard_sandbox_busy_total", pool="rule_test")
    # Production limits (50 ms of CPU per rule): the runaway rule's child is killed as a timeout.
    sandbox = SandboxPool(observer=sandbox_observer("delivery"))
    try:
        result = await sandbox.evaluate(runaway, None, envelope)
    finally:
        await sandbox.close()
    assert [f.cause for f in result.faults] == ["timeout"]
    assert sample("switchboard_sandbox_kills_total", pool="delivery", reason="timeout") == kills + 1
    # One slot, held by a long rule: the next evaluation finds no slot within 20 ms.
    held = SandboxPool(
        max_children=1, rule_timeout=5.0, event_budget=5.0, acquire_timeout=0.02, observer=sandbox_observer("rule_test")
    )
    try:
        holder = asyncio.create_task(held.evaluate(runaway, None, envelope))
        await eventually(lambda: held._slots.locked())
        refused = await held.evaluate([{"expr": "true", "action": {"drop": True}}], None, envelope)
        assert [f.cause for f in refused.faults] == ["sandbox_busy"]
        holder.cancel()
    finally:
        await held.close()
    assert sample("switchboard_sandbox_busy_total", pool="rule_test") == busy + 1


async def test_doorbell_rings_and_drops_are_counted() -> None:
    hub = DoorbellHub()
    endpoint = f"ep_{uuid.uuid4().hex[:8]}"
    rings = sample("switchboard_doorbell_rings_total", transport="sse")
    drops = sample("switchboard_doorbell_drops_total", transport="sse")
    with hub.subscription(endpoint, ["work"], "sse") as sub:
        taken = 0
        while hub.offer(Ring(f"td_{taken}", endpoint, "work", "issues", "github", "t")) is not None:
            taken += 1
        assert taken == sub.buffer.maxsize
    assert sample("switchboard_doorbell_rings_total", transport="sse") == rings + taken
    assert sample("switchboard_doorbell_drops_total", transport="sse") == drops + 1
