"""The workflow sandbox every worker runs workflows in: Temporal's own, with its per-call code compiled once."""

from __future__ import annotations

import functools
from types import CodeType
from typing import Any, cast

from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from temporalio.worker.workflow_sandbox._runner import _Instance


@functools.lru_cache(maxsize=64)
def _compiled(code: str) -> CodeType:
    """The sandbox's few fixed snippets (activate, serialization and store context, create), compiled once each."""
    return compile(code, "<string>", "exec")


class _CompiledInstance(_Instance):
    """A sandboxed workflow instance that executes each of the sandbox's code snippets from a cached compile.

    The SDK runs every crossing into the sandbox as ``exec(<source text>)``: one per activation and one per
    payload it encodes or decodes (for that payload's serialization and store context), about 31 per delivery,
    and each compiles the same two lines again (~35 us each, measured). The snippets, their globals, the importer
    and the restrictions are the SDK's own; only the compile is shared. tests/test_workflow_runner.py pins the
    SDK method this overrides.
    """

    def _run_code(self, code: str, **extra_globals: Any) -> None:
        # exec() takes the code object where the SDK passes the text; the cast keeps the SDK's signature.
        super()._run_code(cast(str, _compiled(code)), **extra_globals)


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
