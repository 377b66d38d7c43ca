"""Domain errors and the store's one translation of psycopg failures into them.

Every public store method (and store function that touches PostgreSQL) is decorated with `translates_errors`,
so nothing above `store/` ever sees a psycopg exception: it sees `StoreUnavailable` (an outage, retry later),
`StoreRejected` (the database refused the data, never retry) or one of the domain errors below. A domain
error carries only a stable `code` and a client-safe `message`; each boundary above maps it once: activities
to Temporal's ApplicationError (activities/errors.py), the API to an HTTP status (api/errors.py).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, NoReturn, TypeVar, cast

import psycopg

F = TypeVar("F", bound=Callable[..., Any])

TRANSLATED = "__translates_errors__"
"""Attribute the decorator sets on what it wraps, so a test can prove every store entry point is covered."""


class DomainError(Exception):
    """A failure with a stable machine code and a client-safe message."""

    code = "internal"
    retryable = False
    """Whether the same call may succeed later (an outage), as opposed to a verdict that replays identically."""

    def __init__(self, message: str = "", *, code: str | None = None) -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.code.replace("_", " ")
        if code is not None:
            self.code = code


class NotFound(DomainError):
    code = "not_found"


class Conflict(DomainError):
    code = "conflict"


class Forbidden(DomainError):
    code = "forbidden"


class InvalidArgument(DomainError):
    code = "invalid_argument"


class CeilingExceeded(DomainError):
    code = "ceiling_exceeded"


class ForbiddenSourceType(DomainError):
    code = "forbidden_source_type"


class Unauthenticated(DomainError):
    code = "unauthenticated"


class RuleRejected(DomainError):
    """A rule list failed save-time validation; the code is routing's, verbatim (routing.rules.ERROR_CODES)."""

    code = "invalid_rule"


class SandboxBusy(DomainError):
    """The rule sandbox could not answer in time (every slot taken, or closed): the same call may succeed later."""

    code = "sandbox_busy"
    retryable = True


class RuleNotFound(DomainError):
    code = "rule_not_found"


class StoreUnavailable(DomainError):
    """PostgreSQL could not be reached or interrupted the transaction: the same call may succeed later."""

    code = "unavailable"
    retryable = True


class StoreRejected(DomainError):
    """The database or its driver refused the data: the same call can never succeed, so it must not be retried."""

    code = "store_rejected"

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


# Constraints whose violation is a domain answer rather than a refusal of the data: the statement named a row
# that does not exist. Keyed by the name PostgreSQL reports (tests/store/test_errors.py checks each one exists).
CONSTRAINT_ERRORS: dict[str, tuple[type[DomainError], str]] = {
    "agents_owner_human_id_fkey": (NotFound, "unknown human"),
    "endpoints_agent_id_fkey": (NotFound, "unknown agent"),
    "friend_edges_from_human_id_fkey": (NotFound, "unknown human"),
    "friend_edges_to_human_id_fkey": (NotFound, "unknown human"),
}


def translate(exc: Exception) -> DomainError:
    """The one mapping from a driver (or validation) failure to the store's domain errors."""
    if isinstance(exc, DomainError):
        return exc
    if isinstance(exc, psycopg.errors.IntegrityError):
        known = CONSTRAINT_ERRORS.get(exc.diag.constraint_name or "")
        if known is not None:
            error, message = known
            return error(message)
    if is_transient(exc):
        return StoreUnavailable(short_message(exc))
    return StoreRejected(short_message(exc), error_type=type(exc).__name__)


def _raise_translated(exc: Exception) -> NoReturn:
    translated = translate(exc)
    if translated is exc:
        raise exc
    raise translated from exc


class _TranslatedContext(contextlib.AbstractAsyncContextManager[Any]):
    """An async context manager whose own failures (entering, leaving) leave it translated.

    An exception raised by the caller's block passes through untouched: it is not the store's to name.
    """

    def __init__(self, inner: contextlib.AbstractAsyncContextManager[Any]) -> None:
        self.inner = inner

    async def __aenter__(self) -> Any:
        try:
            return await self.inner.__aenter__()
        except Exception as exc:
            _raise_translated(exc)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            return await self.inner.__aexit__(exc_type, exc, tb)
        except Exception as failure:
            if failure is exc:
                raise
            _raise_translated(failure)
        return None


def translates_errors(fn: F) -> F:
    """Decorate a store entry point so psycopg and validation failures leave it as domain errors.

    Covers coroutine functions, async generators, functions returning an async context manager
    (`contextlib.asynccontextmanager`) and plain functions (migrations). DomainErrors pass through unchanged;
    cancellation (a BaseException) is never touched.
    """
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
            async with contextlib.aclosing(fn(*args, **kwargs)) as items:
                while True:
                    # Only the generator's own steps are translated, never what the consumer throws in.
                    try:
                        item = await anext(items)
                    except StopAsyncIteration:
                        return
                    except Exception as exc:
                        _raise_translated(exc)
                    yield item

        setattr(gen_wrapper, TRANSLATED, True)
        return cast(F, gen_wrapper)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                _raise_translated(exc)

        setattr(wrapper, TRANSLATED, True)
        return cast(F, wrapper)

    @functools.wraps(fn)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            _raise_translated(exc)
        if isinstance(result, contextlib.AbstractAsyncContextManager):
            return _TranslatedContext(result)
        return result

    setattr(sync_wrapper, TRANSLATED, True)
    return cast(F, sync_wrapper)


def is_translated(fn: object) -> bool:
    """Whether a store entry point goes through `translates_errors`."""
    return bool(getattr(fn, TRANSLATED, False))
