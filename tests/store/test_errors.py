"""psycopg failures map to domain errors in one place: an outage is retried, a refusal of the data is final."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import inspect
import pkgutil
from collections.abc import AsyncIterator
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import BaseModel, ValidationError

import store
import store.db
from store.db import Pool, open_pool
from store.errors import (
    CONSTRAINT_ERRORS,
    DomainError,
    NotFound,
    StoreRejected,
    StoreUnavailable,
    is_translated,
    translate,
    translates_errors,
)
from store.identity import IdentityStore
from store.inbox import InboxStore


class _Shape(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Shape.model_validate({"n": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


TRANSIENT = [
    psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly"),
    psycopg.InterfaceError("the connection is closed"),
    PoolTimeout("couldn't get a connection after 10.00 sec"),
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.DeadlockDetected("deadlock detected"),
    pg.SerializationFailure("could not serialize access"),
    pg.QueryCanceled("canceling statement due to statement timeout"),
    pg.CannotConnectNow("the database system is starting up"),
    pg.TooManyConnections("sorry, too many clients already"),
    pg.LockNotAvailable("could not obtain lock"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError(),
]
DETERMINISTIC = [
    psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
    pg.CheckViolation("new row violates check constraint"),
    pg.UniqueViolation("duplicate key value violates unique constraint"),
    pg.NotNullViolation("null value in column"),
    pg.InvalidTextRepresentation("invalid input syntax"),
    pg.UntranslatableCharacter("unsupported Unicode escape sequence"),
    pg.UndefinedColumn("column does not exist"),
    pg.SyntaxError("syntax error"),
    pg.ProgramLimitExceeded("index row size exceeds btree maximum"),  # an OperationalError, but final
    pg.InvalidParameterValue("payload string too long"),
    psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed"),
    _validation_error(),
    UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    ValueError("bad"),
    AssertionError(),
]


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_connection_level_failures_are_retryable(exc: Exception) -> None:
    assert isinstance(translate(exc), StoreUnavailable)


@pytest.mark.parametrize("exc", DETERMINISTIC, ids=lambda e: type(e).__name__)
def test_refusals_of_the_data_are_final_and_named(exc: Exception) -> None:
    out = translate(exc)
    assert isinstance(out, StoreRejected)
    assert out.error_type == type(exc).__name__
    assert len(out.message) <= 160 and "\n" not in out.message
    if isinstance(exc, UnicodeError):
        assert "\ud800" not in out.message


async def test_the_decorator_translates_once_and_lets_domain_errors_through() -> None:
    @translates_errors
    async def refuses() -> None:
        raise pg.CheckViolation("nope")

    @translates_errors
    async def missing() -> None:
        raise NotFound("unknown webhook")

    with pytest.raises(StoreRejected) as info:
        await refuses()
    assert isinstance(info.value.__cause__, pg.CheckViolation)
    with pytest.raises(NotFound):
        await missing()


# -- every entry point translates ----------------------------------------------------------------------------

PRODUCT = ("api", "activities", "routing", "switchboard", "workflows", "worker.py")
ROOT = Path(__file__).resolve().parents[2]
# Public functions of store/db.py that never reach PostgreSQL.
OFFLINE = {"migration_files"}


def _store_modules() -> list[ModuleType]:
    return [importlib.import_module(f"store.{m.name}") for m in pkgutil.iter_modules(store.__path__)]


def _store_classes() -> list[type]:
    """Classes defined in store/ that hold a pool or a connection: the stores."""
    found = []
    for module in _store_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            params = inspect.signature(cls.__init__).parameters
            if "pool" in params or "conn" in params:
                found.append(cls)
    return found


def test_the_stores_are_found() -> None:
    names = {cls.__name__ for cls in _store_classes()}
    assert {"WebhookStore", "CommitStore", "TodoStore", "ScheduleStore", "EventStore", "InboxStore"} <= names
    assert {"IdentityStore", "RouteStore", "RuleStore", "CollectorStore", "DoorbellStore", "Listener"} <= names


@pytest.mark.parametrize("cls", _store_classes(), ids=lambda c: c.__name__)
def test_every_public_method_of_a_store_translates(cls: type) -> None:
    methods = {
        name: member
        for name, member in vars(cls).items()
        if not name.startswith("_") and isinstance(member, FunctionType | classmethod | staticmethod)
    }
    assert methods, cls
    untranslated = [name for name, m in methods.items() if not is_translated(getattr(m, "__func__", m))]
    assert untranslated == []


def test_every_database_function_translates() -> None:
    functions = {
        name: fn
        for name, fn in inspect.getmembers(store.db, inspect.isfunction)
        if fn.__module__ == "store.db" and not name.startswith("_")
    }
    assert {"open_pool", "migrate", "ensure_database"} <= functions.keys()
    assert [name for name, fn in functions.items() if name not in OFFLINE and not is_translated(fn)] == []


def test_psycopg_is_imported_only_in_the_store() -> None:
    offenders = []
    for top in PRODUCT:
        paths = [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n == "psycopg" or n.startswith(("psycopg.", "psycopg_pool")) for n in names):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_store_errors_carry_a_code_and_no_http_status() -> None:
    def subclasses(cls: type[DomainError]) -> list[type[DomainError]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    for cls in subclasses(DomainError):
        assert isinstance(cls.code, str) and cls.code
        assert not hasattr(cls, "status"), cls


# -- the shapes the decorator wraps ----------------------------------------------------------------------------


async def test_an_async_generator_translates_its_own_failures_only() -> None:
    @translates_errors
    async def notes() -> AsyncIterator[int]:
        yield 1
        raise pg.AdminShutdown("terminating connection due to administrator command")

    seen = []
    with pytest.raises(StoreUnavailable):
        async for n in notes():
            seen.append(n)
    assert seen == [1]

    @translates_errors
    async def forever() -> AsyncIterator[int]:
        while True:
            yield 1

    with pytest.raises(ValueError, match="the consumer's"):
        async for _ in forever():
            raise ValueError("the consumer's")


async def test_a_context_manager_translates_entering_and_leaving_but_not_the_block() -> None:
    @translates_errors
    @contextlib.asynccontextmanager
    async def refuses_on_exit() -> AsyncIterator[None]:
        yield
        raise pg.CheckViolation("nope")

    with pytest.raises(StoreRejected):
        async with refuses_on_exit():
            pass

    @translates_errors
    @contextlib.asynccontextmanager
    async def quiet() -> AsyncIterator[None]:
        yield

    with pytest.raises(ValueError, match="the block's"):
        async with quiet():
            raise ValueError("the block's")


def test_a_plain_function_translates() -> None:
    with pytest.raises(StoreUnavailable):
        store.db.migrate("postgresql://127.0.0.1:1/nothing?connect_timeout=2")


# -- against the real PostgreSQL -------------------------------------------------------------------------------


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[Pool]:
    opened = await open_pool(database_url, max_size=2, pool_timeout=5)
    yield opened
    await opened.close()


async def _endpoint(identities: IdentityStore) -> str:
    human = await identities.create_human("joe")
    agent = await identities.create_agent(human, "agent")
    vended = await identities.vend_endpoint(
        agent_id=agent, queues=["work"], verbs=["claim"], webhook_max=0, webhook_source_types=[], webhook_queues=[]
    )
    return str(vended["endpoint_id"])


def _sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


async def test_a_connection_killed_mid_statement_is_unavailable(pool: Pool, database_url: str) -> None:
    identities = IdentityStore(pool)
    endpoint_id = await _endpoint(identities)
    with psycopg.connect(database_url) as blocker:
        # The row lock holds the store's UPDATE in flight, so its backend can be terminated mid-statement.
        blocker.execute("SELECT id FROM endpoints WHERE id = %s FOR UPDATE", (endpoint_id,))
        revoke = asyncio.create_task(identities.revoke_endpoint(endpoint_id))
        waiting: list[tuple[Any, ...]] = []
        for _ in range(200):
            waiting = _sql(
                database_url,
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the revoke never waited on the lock"
        _sql(database_url, "SELECT pg_terminate_backend(%s)", waiting[0][0])
        with pytest.raises(StoreUnavailable) as info:
            await revoke
        blocker.rollback()
    assert isinstance(info.value.__cause__, psycopg.OperationalError)
    # The pool replaces the dead connection: the same call succeeds on retry.
    assert await identities.revoke_endpoint(endpoint_id) is True


async def test_a_closed_pool_is_unavailable(database_url: str) -> None:
    closed = await open_pool(database_url, max_size=1)
    await closed.close()
    with pytest.raises(StoreUnavailable):
        await IdentityStore(closed).create_human("joe")
    with pytest.raises(StoreUnavailable):
        async with InboxStore(closed).claim(10):
            pass


async def test_an_unreachable_server_is_unavailable() -> None:
    unreachable: Pool = AsyncConnectionPool(
        "postgresql://127.0.0.1:1/nothing?connect_timeout=1", open=False, timeout=0.5
    )
    await unreachable.open(wait=False)
    try:
        with pytest.raises(StoreUnavailable) as info:
            await IdentityStore(unreachable).create_human("joe")
        assert isinstance(info.value.__cause__, PoolTimeout)
    finally:
        await unreachable.close()


async def test_a_foreign_key_to_nothing_is_not_found(pool: Pool) -> None:
    identities = IdentityStore(pool)
    with pytest.raises(NotFound, match="unknown human") as info:
        await identities.create_agent("hu_missing", "agent")
    assert isinstance(info.value.__cause__, pg.ForeignKeyViolation)
    with pytest.raises(NotFound, match="unknown agent"):
        await identities.vend_endpoint(
            agent_id="ag_missing", queues=["w"], verbs=[], webhook_max=0, webhook_source_types=[], webhook_queues=[]
        )
    human = await identities.create_human("joe")
    with pytest.raises(NotFound, match="unknown human"):
        await identities.set_friend_edge(human, "hu_missing", "approved")
    with pytest.raises(NotFound, match="unknown human"):
        await identities.set_friend_edge("hu_missing", human, "approved")


async def test_a_constraint_violation_is_a_named_refusal(pool: Pool, database_url: str) -> None:
    _sql(database_url, "ALTER TABLE humans ADD CONSTRAINT test_refuses_poison CHECK (name <> 'poison')")
    with pytest.raises(StoreRejected) as info:
        await IdentityStore(pool).create_human("poison")
    assert info.value.error_type == "CheckViolation"
    assert info.value.message.startswith("23514 ") and "test_refuses_poison" in info.value.message
    assert _sql(database_url, "SELECT count(*) FROM humans") == [(0,)]


async def test_a_failure_inside_a_claimed_inbox_batch_passes_through(pool: Pool) -> None:
    with pytest.raises(ValueError, match="relay's own"):
        async with InboxStore(pool).claim(10):
            raise ValueError("relay's own")


def test_every_named_constraint_exists(database_url: str) -> None:
    names = {r[0] for r in _sql(database_url, "SELECT conname FROM pg_constraint")}
    assert set(CONSTRAINT_ERRORS) <= names
