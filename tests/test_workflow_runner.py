"""runtime/workflow_runner.py: the worker's sandbox, with its code snippets compiled once."""

from __future__ import annotations

import inspect

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance

from runtime import workflow_runner as module
from runtime.workflow_runner import WorkflowRunner, workflow_runner
from switchboard.request_ids import RequestIdInterceptor
from tests.workflows.replay import committed, committed_names
from worker import WORKFLOWS


def test_the_sdk_method_the_runner_overrides_is_still_there_with_its_signature() -> None:
    # An SDK upgrade that renames or reshapes it must fail here, not silently fall back to compiling per call.
    params = list(inspect.signature(_Instance._run_code).parameters.values())
    assert [p.name for p in params[:2]] == ["self", "code"]
    assert params[2].kind is inspect.Parameter.VAR_KEYWORD
    assert "exec(code" in inspect.getsource(_Instance._run_code)


async def test_every_committed_history_replays_in_the_workers_runner_and_its_snippets_compile_once() -> None:
    runner = workflow_runner()
    assert isinstance(runner, WorkflowRunner) and isinstance(runner, SandboxedWorkflowRunner)
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[RequestIdInterceptor()],
        workflow_runner=runner,
    )
    module._compiled.cache_clear()
    names = committed_names()
    assert names
    for name in names:
        await replayer.replay_workflow(committed(name))
    info = module._compiled.cache_info()
    # Fixed snippets (activate, serialization and store context, instance creation) and one import per workflow
    # class: each compiled once, then reused for every run and payload.
    assert 0 < info.currsize <= 4 + len(WORKFLOWS) and info.misses == info.currsize
    assert info.hits > 10 * len(names)
