"""The connection pool: a database restart under it costs no checkout."""

from __future__ import annotations

import time

import psycopg

from store.db import open_pool


async def test_pool_replaces_connections_killed_under_it(database_url: str) -> None:
    pool = await open_pool(database_url, max_size=2, min_size=2)
    try:
        await pool.wait()
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
        # Every pooled backend dies (as in a database restart): the next checkout still works.
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            # pg_terminate_backend only signals; a restart is over once the old backends are gone (their FATAL
            # sent), which is what the pool's check reads from the socket (store/db.py _check_connection).
            deadline = time.monotonic() + 30
            while admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone() != (0,):
                assert time.monotonic() < deadline, "the terminated backends never exited"
                time.sleep(0.01)
        for _ in range(3):
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT 1 AS one")
                assert (await cur.fetchone()) == {"one": 1}
    finally:
        await pool.close()
