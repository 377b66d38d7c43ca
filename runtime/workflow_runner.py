"""The workflow sandbox every worker runs workflows in: Temporal's own, with two of its per-call costs removed.

The one place Switchboard reaches into temporalio's internals (`docs/workflows.md`, "The sandbox workflows run
in", says why and what it costs without). The restrictions, the importer and the isolation of each run are the
SDK's own; this module changes how often the same work is done, never what runs inside the sandbox:

- every crossing into the sandbox is an ``exec`` of one of a few fixed source snippets; each is compiled once;
- a payload's serialization and store contexts (SDK data: namespace, workflow id and type, the pending command's
  activity type and queue) are read from the sandboxed instance directly, where the SDK enters the sandbox for
  each payload to ask it the same question.

tests/test_workflow_runner.py holds both to the SDK's own answers by replaying every committed history.
"""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any, cast

from temporalio.converter import SerializationContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._runner import _Instance


@functools.lru_cache(maxsize=64)
def _compiled(code: str) -> CodeType:
    """One of the sandbox's fixed snippets (activation, instance creation, a context lookup), compiled once."""
    return compile(code, "<string>", "exec")


class _CompiledInstance(_Instance):
    """A sandboxed run whose snippets come from a shared compile and whose payload contexts are read directly."""

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        # exec() takes the code object where the SDK passes the text; the cast keeps the SDK's signature.
        super()._run_code(cast(str, _compiled(code)), **extra_globals)

    # The SDK's command info and store context types live in private modules: typed loosely here, on purpose.

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        """The payload's serialization context, from the sandboxed instance without entering the sandbox."""
        context: SerializationContext | None = self._in_sandbox().get_serialization_context(command_info)
        return context

    def get_external_store_context(self, command_info: Any) -> Any:
        """The payload's external store context, from the sandboxed instance without entering the sandbox."""
        return self._in_sandbox().get_external_store_context(command_info)

    def _in_sandbox(self) -> Any:
        # Made by the SDK's instance-creation snippet, in these globals; every module passes through the sandbox,
        # so its answers are the objects the SDK's own lookup inside the sandbox returns.
        return self.globals_and_locals["__temporal_in_sandbox"]


class WorkflowRunner(SandboxedWorkflowRunner):
    """SandboxedWorkflowRunner (same restrictions, same isolation per run) whose instances are _CompiledInstance."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        """A sandboxed instance for one run."""
        return _CompiledInstance(det, self.runner_class, self.restrictions)


def workflow_runner() -> WorkflowRunner:
    """The runner of every worker and of the replay tests: sandboxed (the determinism guard), every import passed
    through, so only the workflow module itself is executed again per run."""
    return WorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())
