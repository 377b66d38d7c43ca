"""Domain errors leave activities as ApplicationErrors once: deterministic ones final, outages retried and logged."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import pkgutil
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities
from activities.errors import STORE_REJECTED, STORE_UNAVAILABLE, TRANSLATED, VALIDATION_ERROR, application_errors
from activities.models import LoadGrantInput, QueuedEvaluateInput
from activities.route import RouteActivities
from activities.schedules import PrepareFireInput, RecordFireInput, ScheduleActivities
from store.commits import CommitStore
from store.db import Pool, open_pool
from store.errors import (
    Conflict,
    DomainError,
    InvalidArgument,
    NotFound,
    RuleRejected,
    SandboxBusy,
    StoreRejected,
    StoreUnavailable,
)
from store.schedules import ScheduleStore
from store.webhooks import WebhookStore
from tests.helpers import delivery_input

SLOT = "2026-01-01T00:00:00Z"


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[Pool]:
    opened = await open_pool(database_url, max_size=2, pool_timeout=5)
    yield opened
    await opened.close()


def _sql(url: str, query: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query.encode())


def _activity_methods() -> list[tuple[str, Any]]:
    found = []
    for info in pkgutil.iter_modules(activities.__path__):
        module = importlib.import_module(f"activities.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for name, member in vars(cls).items():
                if hasattr(member, "__temporal_activity_definition"):
                    found.append((f"{cls.__name__}.{name}", member))
    return found


def _env(activity_type: str) -> ActivityEnvironment:
    """An activity environment whose info names the activity, as a worker's would."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type=activity_type, workflow_id="delivery-wh_1-abc")
    return env


def test_every_activity_goes_through_the_translation() -> None:
    methods = dict(_activity_methods())
    assert {"RouteActivities.commit_delivery", "ScheduleActivities.record_fire", "UpkeepActivities.reap_todos"} <= set(
        methods
    )
    assert [name for name, fn in methods.items() if not getattr(fn, TRANSLATED, False)] == []


async def test_a_refusal_of_the_data_is_final(pool: Pool, database_url: str) -> None:
    # PostgreSQL refuses this row on every attempt: retrying can only repeat the refusal.
    _sql(database_url, "ALTER TABLE schedule_fires ADD CONSTRAINT test_refuses CHECK (event_id NOT LIKE 'poison%')")
    acts = ScheduleActivities(ScheduleStore(pool))
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(
            acts.record_fire, RecordFireInput(schedule_id="sc_1", event_id="poison-1", slot=SLOT)
        )
    err = info.value
    assert err.non_retryable and err.type == STORE_REJECTED == "StoreRejected"
    # RouteDelivery's faulted path reads (error type, message) from the details.
    error_type, message = err.details
    assert error_type == "CheckViolation" and str(message).startswith("23514 ")
    assert isinstance(err.__cause__, StoreRejected)


async def test_an_outage_is_retried_and_logged_with_the_activity(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    closed = await open_pool(database_url, max_size=1)
    await closed.close()
    acts = ScheduleActivities(ScheduleStore(closed))
    with caplog.at_level(logging.WARNING), pytest.raises(ApplicationError) as info:
        await _env("prepare_schedule_fire").run(acts.prepare_fire, PrepareFireInput(schedule_id="sc_1", slot=SLOT))
    err = info.value
    assert not err.non_retryable and err.type == STORE_UNAVAILABLE
    assert isinstance(err.__cause__, StoreUnavailable)
    [line] = [r.getMessage() for r in caplog.records if "will retry" in r.getMessage()]
    assert "prepare_schedule_fire" in line and "delivery-wh_1-abc" in line  # the activity's info rides on the line


async def test_an_unexpected_failure_is_retried_and_logged_with_its_traceback(
    pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        async def evaluate(self, rules: Any, params: Any, envelope: Any) -> Any:
            raise RuntimeError("the sandbox lost its child")

    acts = RouteActivities(WebhookStore(pool, box=None), CommitStore(pool), Broken())  # type: ignore[arg-type]
    rules = QueuedEvaluateInput(delivery=delivery_input(), rules=[{"expr": "true", "action": {"queue": "work"}}])
    with caplog.at_level(logging.ERROR), pytest.raises(ApplicationError) as info:
        await _env("evaluate_rules").run(acts.evaluate_rules, rules)
    err = info.value
    assert not err.non_retryable and err.type == "RuntimeError"
    [record] = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert "evaluate_rules" in record.getMessage() and record.exc_info is not None


async def test_a_webhook_that_is_gone_is_an_answer_not_an_error(pool: Pool) -> None:
    acts = RouteActivities(WebhookStore(pool, box=None), CommitStore(pool))  # type: ignore[arg-type]
    result = await ActivityEnvironment().run(acts.load_grant, LoadGrantInput(webhook_id="wh_missing"))
    assert result.grant is None


class _Input(BaseModel):
    n: int


@activity.defn(name="raises")
@application_errors
async def _raises(exc: Exception) -> None:
    raise exc


def _validation_error() -> ValidationError:
    try:
        _Input.model_validate({"n": "secret-value"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "exc",
    [NotFound("unknown webhook"), Conflict("todo is not pending"), InvalidArgument("bad"), RuleRejected("no")],
    ids=lambda e: type(e).__name__,
)
async def test_deterministic_domain_errors_are_final(exc: DomainError) -> None:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(_raises, exc)
    assert info.value.non_retryable and info.value.type == type(exc).__name__
    assert list(info.value.details) == [type(exc).__name__, exc.message]


@pytest.mark.parametrize(
    "exc", [StoreUnavailable("connection lost"), SandboxBusy("every slot taken")], ids=lambda e: type(e).__name__
)
async def test_errors_that_may_pass_are_retried(exc: DomainError) -> None:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(_raises, exc)
    assert not info.value.non_retryable and info.value.type == type(exc).__name__


async def test_invalid_data_is_final_and_never_echoed() -> None:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(_raises, _validation_error())
    assert info.value.non_retryable and info.value.type == VALIDATION_ERROR
    assert "secret-value" not in str(info.value)


async def test_an_application_error_raised_on_purpose_passes_unchanged() -> None:
    mine = ApplicationError("chosen", type="Mine", non_retryable=True)
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(_raises, mine)
    assert info.value is mine
