"""runtime/workflow_runner.py: the worker's sandbox answers as the SDK's own does, and compiles each snippet once.

Behaviour only: every committed history replays in the worker's runner; every payload context it reads without
entering the sandbox equals the SDK's own answer (asked inside the sandbox, the SDK's way); and the compile cache
is what runs every crossing. An SDK release that stops calling these methods, or answers differently, fails here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox._runner import _Instance

from runtime import workflow_runner as module
from runtime.workflow_runner import WorkflowRunner, _CompiledInstance, workflow_runner
from switchboard.request_ids import RequestIdInterceptor
from tests.workflows.replay import committed, committed_names
from worker import WORKFLOWS


class _Compared(_CompiledInstance):
    """The worker's instance, also asking every context the SDK's way (inside the sandbox) and comparing."""

    compared: ClassVar[Counter[str]] = Counter()

    def get_serialization_context(self, command_info: Any) -> Any:
        ours = super().get_serialization_context(command_info)
        assert ours == _Instance.get_serialization_context(self, command_info)
        self.compared[type(ours).__name__] += 1
        return ours

    def get_external_store_context(self, command_info: Any) -> Any:
        ours = super().get_external_store_context(command_info)
        assert ours == _Instance.get_external_store_context(self, command_info)
        self.compared["store"] += 1
        return ours


class _ComparingRunner(WorkflowRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Compared(det, self.runner_class, self.restrictions)


def _replayer(runner: SandboxedWorkflowRunner) -> Replayer:
    return Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[RequestIdInterceptor()],
        workflow_runner=runner,
    )


async def test_contexts_read_without_entering_the_sandbox_equal_the_sdks_on_every_committed_history() -> None:
    replayer = _replayer(_ComparingRunner(restrictions=workflow_runner().restrictions))
    _Compared.compared.clear()
    for name in committed_names():
        await replayer.replay_workflow(committed(name))
    # Both kinds were asked for: the workflow's own payloads and its activities' (regular and local).
    assert _Compared.compared["WorkflowSerializationContext"] > 0
    assert _Compared.compared["ActivitySerializationContext"] > 0
    assert _Compared.compared["store"] > 0


async def test_every_committed_history_replays_in_the_workers_runner_and_its_snippets_compile_once() -> None:
    runner = workflow_runner()
    assert isinstance(runner, SandboxedWorkflowRunner)
    replayer = _replayer(runner)
    module._compiled.cache_clear()
    names = committed_names()
    assert names
    for name in names:
        await replayer.replay_workflow(committed(name))
    info = module._compiled.cache_info()
    # A few fixed snippets (activation, instance creation) and one import per workflow class, each compiled once
    # and then reused by every activation of every run.
    assert 0 < info.currsize <= 4 + len(WORKFLOWS) and info.misses == info.currsize
    assert info.hits > len(names)
