"""The activities' one translation of failures into Temporal's ApplicationError.

Every activity is decorated with `application_errors`, so what leaves an activity is always an ApplicationError
whose `non_retryable` says whether Temporal may try again:

- a deterministic failure (a domain verdict such as not_found or conflict, a refusal of the data by PostgreSQL,
  an input that fails validation) replays identically, so it is final: retrying it would only repeat it;
- an outage (StoreUnavailable, a busy sandbox) and anything unexpected are retried under the workflow's retry
  policy, and logged with the activity's info each time, so no retry happens in silence.

The ApplicationError `type` is the domain error's class name; workflows branch on it (RouteDelivery ends a
commit refused with type STORE_REJECTED as faulted), so these names are part of the workflow contract.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError, TemporalError

from store.errors import DomainError, StoreRejected

P = ParamSpec("P")
R = TypeVar("R")

STORE_REJECTED = StoreRejected.__name__
"""ApplicationError type of a store refusal; details are (error type, message). Recorded in histories: keep it."""
STORE_UNAVAILABLE = "StoreUnavailable"
"""ApplicationError type of a store outage (retried)."""
VALIDATION_ERROR = ValidationError.__name__
"""ApplicationError type of an input that fails validation (final), as Temporal names a raw ValidationError."""

TRANSLATED = "__application_errors__"
"""Attribute set on every wrapped activity, so a test can prove each one goes through the translation."""


def application_error(exc: Exception) -> ApplicationError:
    """The one mapping from an activity's failure to Temporal: deterministic ones are final, the rest retried."""
    if isinstance(exc, ApplicationError):
        return exc
    info = activity.info()
    if isinstance(exc, DomainError):
        if exc.retryable:
            # An outage must not lose work: Temporal retries until the dependency answers again.
            activity.logger.warning(
                "%s failed (attempt %d, will retry): %s", info.activity_type, info.attempt, exc.message
            )
            return ApplicationError(f"{info.activity_type} failed: {exc.message}", type=type(exc).__name__)
        error_type = exc.error_type if isinstance(exc, StoreRejected) else type(exc).__name__
        activity.logger.error("%s refused: %s: %s", info.activity_type, error_type, exc.message)
        return ApplicationError(
            f"{error_type}: {exc.message}", error_type, exc.message, type=type(exc).__name__, non_retryable=True
        )
    if isinstance(exc, ValidationError):
        # Locations and reasons only: the refused values may be a delivery's content.
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)[:5])
        activity.logger.error("%s refused its data: %s", info.activity_type, reasons)
        return ApplicationError(f"{exc.title}: {reasons}", type=VALIDATION_ERROR, non_retryable=True)
    # Unknown: a bug or an unclassified outage. Retried, as Temporal would, but never silently.
    activity.logger.error(
        "%s failed unexpectedly (attempt %d, will retry): %s: %s",
        info.activity_type,
        info.attempt,
        type(exc).__name__,
        exc,
        exc_info=exc,
    )
    return ApplicationError(f"{type(exc).__name__}: {exc}", type=type(exc).__name__)


def application_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate an activity (under `@activity.defn`) so every failure leaves it through `application_error`."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except TemporalError:
            raise  # already Temporal's own shape (an ApplicationError raised on purpose, a cancellation)
        except Exception as exc:
            raise application_error(exc) from exc

    setattr(wrapper, TRANSLATED, True)
    return wrapper
