"""Domain errors raised by the store; each boundary maps them to its own shape once."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import psycopg

P = ParamSpec("P")
R = TypeVar("R")


class DomainError(Exception):
    """A failure with a stable machine code and a client-safe message."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.code.replace("_", " ")
        if code is not None:
            self.code = code


class NotFound(DomainError):
    code = "not_found"
    status = 404


class Conflict(DomainError):
    code = "conflict"
    status = 409


class Forbidden(DomainError):
    code = "forbidden"
    status = 403


class InvalidArgument(DomainError):
    code = "invalid_argument"
    status = 422


class CeilingExceeded(DomainError):
    code = "ceiling_exceeded"
    status = 403


class ForbiddenSourceType(DomainError):
    code = "forbidden_source_type"
    status = 403


class Unauthenticated(DomainError):
    code = "unauthenticated"
    status = 401


class RuleRejected(DomainError):
    """A rule list failed save-time validation; the code is routing's, verbatim (422)."""

    code = "invalid_rule"
    status = 422


class RuleNotFound(DomainError):
    code = "rule_not_found"
    status = 404


class StoreUnavailable(DomainError):
    """PostgreSQL could not be reached or interrupted the transaction: the same call may succeed later."""

    code = "unavailable"
    status = 503


class StoreRejected(DomainError):
    """The database or its driver refused the data: the same call can never succeed, so it must not be retried."""

    code = "store_rejected"
    status = 500

    def __init__(self, message: str, *, error_type: str) -> None:
        super().__init__(message)
        self.error_type = error_type


# SQLSTATE classes a retry can outlive: connection exceptions, transaction rollback (serialization, deadlock),
# insufficient resources, object not in prerequisite state (lock not available), operator intervention
# (admin shutdown, pg_terminate_backend, query canceled) and system errors. Everything else is a statement the
# server will refuse again: data (22), integrity (23), syntax/undefined objects (42), program limits (54), ...
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
_MESSAGE_MAX = 160


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the failed store call can succeed (an outage), as opposed to a refusal of the data."""
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is not None:
            return exc.sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES
        # Raised by the client with no server verdict: a lost or closed connection, or a pool timeout.
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return isinstance(exc, OSError | TimeoutError)


def short_message(exc: BaseException) -> str:
    """A one-line description of a store failure that carries no delivery content."""
    if isinstance(exc, psycopg.Error) and exc.sqlstate is not None:
        text = exc.diag.message_primary or ""
        if exc.sqlstate.startswith("22"):
            # Data exceptions quote the refused value after a colon ("invalid input syntax for type json: …").
            text = text.split(":", 1)[0]
        text = f"{exc.sqlstate} {text}"
    else:
        lines = str(exc).splitlines()
        text = lines[0] if lines else ""
        if isinstance(exc, UnicodeError):
            text = "text the database cannot encode"
    return text[:_MESSAGE_MAX]


def translate(exc: Exception) -> DomainError:
    """The one mapping from a driver (or validation) failure to the store's domain errors."""
    if isinstance(exc, DomainError):
        return exc
    if is_transient(exc):
        return StoreUnavailable(short_message(exc))
    return StoreRejected(short_message(exc), error_type=type(exc).__name__)


def translates_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate a store method so psycopg and validation failures leave it as StoreUnavailable / StoreRejected."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            translated = translate(exc)
            if translated is exc:
                raise
            raise translated from exc

    return wrapper
