"""Connection pool and migrations: the only place that knows how to reach PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
from collections.abc import AsyncIterator
from importlib.resources.abc import Traversable
from typing import Any

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from store.errors import StoreUnavailable, translates_errors
from switchboard import resources

log = logging.getLogger("switchboard.store")

Pool = AsyncConnectionPool[AsyncConnection[DictRow]]
"""The pool type every store receives: connections that return dict rows."""

_MIGRATION_LOCK = 0x5B0A_4D16  # advisory lock id held while migrating

# psycopg_pool retries a lost server with a doubling delay (1, 2, 4 s…) until `reconnect_timeout`, then drops that
# connection and starts afresh at the next request. A short round keeps the retries about a second apart, so the
# pools refill within about a second of PostgreSQL answering again, however long it was away.
RECONNECT_SECONDS = 2.0

# How long after a deadline a block still inside psycopg is cancelled a second time (see bounded).
SECOND_CANCEL_AFTER = 0.05

KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
"""libpq TCP keepalives (ignored on unix sockets), so a peer that vanished is noticed by the kernel too."""


async def _check_connection(conn: AsyncConnection[DictRow]) -> None:
    """Raise if a pooled connection is known dead; a round trip only when its socket says something happened.

    psycopg_pool's own check is an empty statement per checkout: a round trip on every claim, for a connection
    that is almost always fine. An idle connection's socket has nothing to read unless the
    server spoke: a restart or pg_terminate_backend sends its FATAL and closes (readable, then EOF). Only then
    is the round trip made, and it fails the connection so the pool hands out a fresh one. A peer that
    vanished without a word is left to TCP keepalives (KEEPALIVES) and fails its statement, which discards it.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("connection is closed")
    poller = select.poll()  # not select.select: it refuses descriptors past 1023
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
    if poller.poll(0):  # readable, hung up or in error
        await AsyncConnectionPool.check_connection(conn)


@translates_errors
@contextlib.asynccontextmanager
async def bounded(seconds: float) -> AsyncIterator[None]:
    """Run the block for at most ``seconds``, also while PostgreSQL hangs; past that, StoreUnavailable.

    A cancelled psycopg statement asks the server to cancel it and waits for the answer (up to 5 s each); a hung
    server gives neither, so the block would end seconds late. Cancelled a second time, psycopg closes the
    connection at once instead (the pool then replaces it): the block is cancelled at the deadline, and again
    SECOND_CANCEL_AFTER later if it is still running.
    """
    task = asyncio.current_task()
    assert task is not None
    again = False

    def cancel_again() -> None:
        nonlocal again
        again = True
        task.cancel()

    late = asyncio.get_running_loop().call_later(seconds + SECOND_CANCEL_AFTER, cancel_again)
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise StoreUnavailable(f"PostgreSQL did not answer within {seconds:g} s") from exc
    except asyncio.CancelledError as exc:
        # The second cancellation is ours: once it is taken back, a task nobody else cancelled timed out.
        if again and task.uncancel() == 0:
            raise StoreUnavailable(f"PostgreSQL did not answer within {seconds:g} s") from exc
        raise
    finally:
        late.cancel()


class BoundedPool(AsyncConnectionPool[AsyncConnection[DictRow]]):
    """A pool each use of which (the wait for a connection and the statements on it) ends within ``deadline``
    seconds, also while PostgreSQL hangs: then StoreUnavailable (bounded). No deadline: a plain pool."""

    def __init__(self, *args: Any, deadline: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[AsyncConnection[DictRow]]:  # noqa: ASYNC109 (the pool's own signature)
        """A connection for the block, all of it within the pool's deadline."""
        if self.deadline is None:
            async with super().connection(timeout) as conn:
                yield conn
            return
        async with bounded(self.deadline), super().connection(timeout) as conn:
            yield conn


@translates_errors
async def open_pool(
    url: str,
    *,
    max_size: int = 10,
    min_size: int = 1,
    pool_timeout: float = 10.0,
    statement_timeout: float | None = None,
) -> Pool:
    """Open a pool whose connections return dict rows and are checked (_check_connection) before each use;
    `pool_timeout` bounds each wait for a connection. With `statement_timeout`, PostgreSQL cancels any statement
    running longer, and each use of the pool ends within `pool_timeout + statement_timeout` even while the
    server hangs (BoundedPool)."""
    options: dict[str, Any] = {}
    if statement_timeout is not None:
        options["options"] = f"-c statement_timeout={round(statement_timeout * 1000)}"
    pool = BoundedPool(
        url,
        connection_class=AsyncConnection[DictRow],
        min_size=min_size,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "autocommit": True, "connect_timeout": 5, **KEEPALIVES, **options},
        # After a database restart every idle connection is dead: the check at checkout discards it and hands
        # out a fresh one instead of failing the caller's statement (a round trip only when the socket is readable).
        check=_check_connection,
        open=False,
        timeout=pool_timeout,
        reconnect_timeout=RECONNECT_SECONDS,
        deadline=None if statement_timeout is None else pool_timeout + statement_timeout,
    )
    await pool.open(wait=True, timeout=15.0)
    return pool


@translates_errors
def ensure_database(server_url: str, database: str) -> None:
    """Create `database` on the server unless it exists (the embedded dev cluster)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def migration_files(directory: Traversable | None = None) -> list[tuple[str, str]]:
    """(version, sql) for each numbered migration of `directory` (default: the shipped ones), in order."""
    return [(f.name.removesuffix(".sql"), f.read_text(encoding="utf-8")) for f in resources.migration_files(directory)]


@translates_errors
def migrate(url: str, directory: Traversable | None = None) -> list[str]:
    """Apply pending migrations (default: the shipped ones) under an advisory lock; returns those applied now."""
    applied_now: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
            for version, sql in migration_files(directory):
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
                log.info("applied migration %s", version)
                applied_now.append(version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied_now
