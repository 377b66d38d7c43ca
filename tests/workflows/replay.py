"""Replay a workflow run against today's workflow code, and keep its history as a committed pin.

Every workflow path has a history recorded from real runs in tests/workflows/histories/ (see
tests/workflows/test_histories.py for the path of each file). The suite replays all of them with the current
workflow classes, so a change that would break a run in flight fails here before a deploy does. How to change
workflow code without breaking them: docs/workflows.md.

Recording: ``make histories`` (or ``SWITCHBOARD_WRITE_HISTORIES=1`` on a pytest run) writes the history of each
run that a test keeps, but only where no file of that name exists yet. A committed history is never
overwritten by a run of newer code: it pins what runs recorded by older code look like. To re-record a path on
purpose, delete (or rename, e.g. ``*_pre_<patch>.json``) its file first, so the change shows up in review.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from routing.delivery import CommitResult, workflow_id_for
from runtime.workflow_runner import workflow_runner
from tests.conftest import Stack
from worker import WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"
RECORD_ENV = "SWITCHBOARD_WRITE_HISTORIES"


def replayer() -> Replayer:
    """A replayer with every workflow the worker hosts and the worker's data converter."""
    return Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter, workflow_runner=workflow_runner())


def recording() -> bool:
    """Whether this run writes the histories that are still missing."""
    return bool(os.environ.get(RECORD_ENV))


def committed(name: str) -> WorkflowHistory:
    """A committed history, by file name."""
    return WorkflowHistory.from_json(str(uuid.uuid4()), json.loads((HISTORIES / name).read_text()))


def committed_names() -> list[str]:
    """Every committed history's file name, sorted."""
    return sorted(p.name for p in HISTORIES.glob("*.json"))


async def replay_and_keep(handle: WorkflowHandle[Any, Any], name: str) -> WorkflowHistory:
    """Replay the run's history with today's code; when recording and ``name`` is not committed yet, write it."""
    history = await handle.fetch_history()
    await replayer().replay_workflow(history)
    path = HISTORIES / name
    if recording() and not path.exists():
        HISTORIES.mkdir(exist_ok=True)
        path.write_text(history.to_json())
    return history


def handle_for(stack: Stack, webhook_id: str, delivery: str) -> WorkflowHandle[Any, CommitResult]:
    """The RouteDelivery run (the latest, on a redelivery) of one delivery id posted to a webhook."""
    return stack.temporal.get_workflow_handle(
        workflow_id_for(webhook_id, f"{webhook_id}:{delivery}"), result_type=CommitResult
    )


async def decision_attribute(handle: WorkflowHandle[Any, Any]) -> str | None:
    """The run's SwitchboardDecision search attribute: the outcome as operators see it in the Temporal UI."""
    desc = await handle.describe()
    attrs = {k.name: v for k, v in desc.typed_search_attributes}
    value = attrs.get("SwitchboardDecision")
    return value if isinstance(value, str) else None
