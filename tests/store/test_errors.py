"""psycopg failures map to domain errors in one place: an outage is retried, a refusal of the data is final."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ValidationError

from store.errors import NotFound, StoreRejected, StoreUnavailable, translate, translates_errors


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
