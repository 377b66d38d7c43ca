"""What the trust gate and a rule save's replay cost.

A rule save now replays its rules over the webhook's latest 50 stored events in the rule verbs' sandbox
(routing.backtest.recent_faults) before it is accepted; every envelope now carries ``.actor`` (routing.trust).
This prints, with the rule verbs' own sandbox shape (2 children) and a realistic GitHub issue of about 25 KB:

- the replay of the fleet pack (25 rules) over 50 such events: what every save adds;
- the replay of a list whose first rule runs away on every event: where the replay stops (five faulting events);
- building one envelope with and without a trust gate, and the ``.actor`` projection alone.

Run: ``python bench/save_replay.py``. Prints figures only.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rules import github_issue_envelope
from routing.backtest import RecentCheck, StoredEvent, StoredTodo, recent_faults
from routing.envelope import build_envelope
from routing.models import Grant, Target
from routing.router import evaluator
from routing.sandbox import SandboxPool
from routing.trust import actor_projection

EVENTS = 50
ROUNDS = 5
PACK = Path(__file__).resolve().parent.parent / "docs" / "routing" / "rule-packs" / "fleet.json"
GATE = {"logins": ["octo-reporter", "octo-maintainer"], "match": "both"}


class History:
    """The webhook's stored events, in memory (the reads recent_faults makes)."""

    def __init__(self, events: list[StoredEvent]) -> None:
        self.events = {e.id: e for e in events}

    async def recent_event_ids(self, webhook_id: str, limit: int) -> list[str]:
        return list(self.events)[:limit]

    async def stored_events(self, webhook_id: str, event_ids: Sequence[str]) -> list[StoredEvent]:
        return [self.events[i].model_copy() for i in event_ids if i in self.events]

    async def landed_todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        return {}

    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        return {}


def stored(n: int, body: bytes) -> StoredEvent:
    return StoredEvent(
        id=f"ev_{n:04d}",
        webhook_id="wh_1",
        source="github",
        kind="issues",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={"x-github-event": "issues"},
        payload=body,
        payload_size=len(body),
        received_at=datetime.now(UTC),
        routing_trace={"stage": "default"},
        disposition="routed",
        todo_ids=[],
    )


def grant(rules: list[dict[str, Any]], params: dict[str, Any] | None) -> Grant:
    return Grant(
        webhook_id="wh_1",
        owner_endpoint_id="ep_a",
        human_id="hu_1",
        source="github",
        target_queue="work",
        allowed_queues=[],
        targets=[Target(endpoint_id="ep_a", scope_queues=["work"])],
        rules=rules,
        params=params,
        trusted_actors=GATE,
    )


async def timed_replays(history: History, g: Grant, pool: SandboxPool) -> tuple[list[float], RecentCheck]:
    took: list[float] = []
    check = RecentCheck()
    for _ in range(ROUNDS):
        started = time.perf_counter()
        check = await recent_faults(history, g, evaluator(pool))
        took.append(time.perf_counter() - started)
    return took, check


def per_call(fn: Any, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n


async def main() -> None:
    payload = github_issue_envelope()["payload"]
    body = json.dumps(payload).encode()
    history = History([stored(n, body) for n in range(EVENTS)])
    pack = json.loads(PACK.read_text())
    pool = SandboxPool(max_children=2, acquire_timeout=10.0)
    try:
        await recent_faults(history, grant(pack["rules"], pack.get("params")), evaluator(pool))  # warm
        took, check = await timed_replays(history, grant(pack["rules"], pack.get("params")), pool)
        print(f"event body: {len(body)} bytes; {EVENTS} stored events; sandbox of 2 children; {ROUNDS} rounds")
        print(
            f"save replay, fleet pack ({len(pack['rules'])} rules): median {statistics.median(took) * 1000:.0f} ms,"
            f" max {max(took) * 1000:.0f} ms; {check.replayed} events replayed, {len(check.faults)} faulting rules"
        )
        runaway = [{"id": "runaway", "expr": "def f: f; f", "action": {"drop": True}}, *pack["rules"]]
        took, check = await timed_replays(history, grant(runaway, pack.get("params")), pool)
        [fault] = check.faults
        print(
            f"save replay, a runaway first rule: median {statistics.median(took) * 1000:.0f} ms,"
            f" max {max(took) * 1000:.0f} ms; stopped after {check.replayed} events"
            f" ({fault.causes} on {fault.events})"
        )
    finally:
        await pool.close()

    def envelope(gate: Any) -> dict[str, Any]:
        return build_envelope(
            source="github",
            webhook_id="wh_1",
            trust_mode="signed",
            verified=True,
            content_type="application/json",
            headers={"x-github-event": "issues"},
            body=body,
            trusted_actors=gate,
        )

    without = per_call(lambda: envelope(None), 300)
    gated = per_call(lambda: envelope(GATE), 300)
    projection = per_call(lambda: actor_projection("github", payload, GATE), 20000)
    print(
        f"envelope build: {without * 1e6:.0f} µs without a gate, {gated * 1e6:.0f} µs with one;"
        f" .actor projection alone {projection * 1e6:.1f} µs"
    )


if __name__ == "__main__":
    asyncio.run(main())
