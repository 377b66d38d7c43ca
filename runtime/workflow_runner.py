"""The workflow sandbox every worker runs workflows in: Temporal's own, with its per-call code compiled once."""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any, cast

from temporalio.converter import SerializationContext
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker._command_aware_visitor import CommandInfo
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._in_sandbox import InSandbox
from temporalio.worker.workflow_sandbox._runner import _Instance


@functools.lru_cache(maxsize=64)
def _compiled(code: str) -> CodeType:
    """The sandbox's few fixed snippets (activate, create, and any other crossing), compiled once each."""
    return compile(code, "<string>", "exec")


class _CompiledInstance(_Instance):
    """A sandboxed workflow instance that executes each of the sandbox's code snippets from a cached compile, and
    reads payload contexts without entering the sandbox.

    The SDK runs every crossing into the sandbox as ``exec(<source text>)``: one per activation and one per
    payload it encodes or decodes (for that payload's serialization and store context), about 31 per delivery,
    and each compiles the same two lines again (~35 us each, measured). The snippets, their globals, the importer
    and the restrictions are the SDK's own; only the compile is shared. tests/test_workflow_runner.py pins the
    SDK methods this overrides.
    """

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        # exec() takes the code object where the SDK passes the text; the cast keeps the SDK's signature.
        super()._run_code(cast(str, _compiled(code)), **extra_globals)

    # A payload's serialization and store contexts are SDK data (namespace, workflow id and type, the pending
    # command's activity type and queue or target workflow), looked up without running any workflow code. The SDK
    # still enters the sandbox for each (the importer applied around an exec, some 27 times per delivery); every
    # module passes through the sandbox, so the same objects come back when the sandboxed instance is asked
    # directly. Replaying the committed RouteDelivery histories: 12.7-12.9 -> 10.9-11.4 ms of CPU per run.
    # tests/test_workflow_runner.py replays every committed history comparing both ways.

    def get_serialization_context(self, command_info: CommandInfo | None) -> SerializationContext | None:
        """The payload's serialization context, from the sandboxed instance without entering the sandbox."""
        return self._in_sandbox().get_serialization_context(command_info)

    def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
        """The payload's external store context, from the sandboxed instance without entering the sandbox."""
        return self._in_sandbox().get_external_store_context(command_info)

    def _in_sandbox(self) -> InSandbox:
        # Made by the SDK's instance-creation snippet, in these globals (typed loosely there).
        return cast(InSandbox, self.globals_and_locals["__temporal_in_sandbox"])


class WorkflowRunner(SandboxedWorkflowRunner):
    """SandboxedWorkflowRunner (same restrictions, same isolation per run) whose instances compile once."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        """A sandboxed instance for one run (see _CompiledInstance)."""
        return _CompiledInstance(det, self.runner_class, self.restrictions)


def workflow_runner() -> WorkflowRunner:
    """The runner of every worker: sandboxed (determinism guard), every import passed through.

    Only the workflow module itself is re-executed per run, which halves the sandbox's cost per delivery.
    """
    return WorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())
