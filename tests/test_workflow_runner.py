"""runtime/workflow_runner.py: the worker's sandbox, with its code snippets compiled once."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import ClassVar

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import SerializationContext
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import Replayer, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._in_sandbox import InSandbox
from temporalio.worker.workflow_sandbox._runner import _Instance

from runtime import workflow_runner as module
from runtime.workflow_runner import WorkflowRunner, _CompiledInstance, workflow_runner
from switchboard.request_ids import RequestIdInterceptor
from tests.workflows.replay import committed, committed_names
from worker import WORKFLOWS


def test_the_sdk_methods_the_runner_overrides_are_still_there_with_their_signatures() -> None:
    # An SDK upgrade that renames or reshapes them must fail here, not silently fall back to the SDK's path.
    params = list(inspect.signature(_Instance._run_code).parameters.values())
    assert [p.name for p in params[:2]] == ["self", "code"]
    assert params[2].kind is inspect.Parameter.VAR_KEYWORD
    assert "exec(code" in inspect.getsource(_Instance._run_code)
    for name in ("get_serialization_context", "get_external_store_context"):
        sdk = getattr(_Instance, name)
        assert list(inspect.signature(sdk).parameters) == ["self", "command_info"]
        # The SDK's own version asks the sandboxed instance the same question, inside the sandbox.
        assert f"__temporal_in_sandbox.{name}(__temporal_command_info)" in inspect.getsource(sdk)
        assert list(inspect.signature(getattr(InSandbox, name)).parameters) == ["self", "command_info"]


class _Compared(_CompiledInstance):
    """The worker's instance, also asking every context the SDK's way (inside the sandbox) and comparing."""

    compared: ClassVar[Counter[str]] = Counter()

    def get_serialization_context(self, command_info: CommandInfo | None) -> SerializationContext | None:
        ours = super().get_serialization_context(command_info)
        assert ours == _Instance.get_serialization_context(self, command_info)
        self.compared[type(ours).__name__] += 1
        return ours

    def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
        ours = super().get_external_store_context(command_info)
        assert ours == _Instance.get_external_store_context(self, command_info)
        self.compared["store"] += 1
        return ours


class _ComparingRunner(WorkflowRunner):
    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Compared(det, self.runner_class, self.restrictions)


async def test_contexts_read_without_entering_the_sandbox_equal_the_sdks_on_every_committed_history() -> None:
    replayer = Replayer(
        workflows=WORKFLOWS,
        data_converter=pydantic_data_converter,
        interceptors=[RequestIdInterceptor()],
        workflow_runner=_ComparingRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules()),
    )
    _Compared.compared.clear()
    for name in committed_names():
        await replayer.replay_workflow(committed(name))
    # Both kinds were asked for: the workflow's own payloads and its activities' (regular and local).
    assert _Compared.compared["WorkflowSerializationContext"] > 0
    assert _Compared.compared["ActivitySerializationContext"] > 0
    assert _Compared.compared["store"] > 0


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
    # Fixed snippets (activation, instance creation) and one import per workflow class: each compiled once, then
    # reused for every activation of every run (contexts no longer enter the sandbox).
    assert 0 < info.currsize <= 4 + len(WORKFLOWS) and info.misses == info.currsize
    assert info.hits > len(names)
