"""Activities of RouteDelivery: thin wrappers over the store and the sandbox."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

from temporalio import activity

from activities.errors import application_errors
from activities.models import (
    EvaluateHereInput,
    EvaluateHereResult,
    LoadGrantInput,
    LoadGrantResult,
    QueuedEvaluateInput,
)
from routing.delivery import CommitInput, CommitResult, FaultCommitInput
from routing.models import Evaluation, Fault
from routing.router import RuleEvaluator
from routing.rules import describe_rule
from store.commits import CommitStore
from store.errors import NotFound
from store.webhooks import WebhookStore
from switchboard.metrics import record_delivery, record_evaluation, record_triage_decision

# An evaluation from the fair evaluate queue was admitted by Temporal (this worker polls only while it has a
# slot per sandbox child), so a wait for a child here is at most one fast-path evaluation finishing, which the
# sandbox's hard deadline bounds; the bound sits under the activity's 10 s start-to-close, far above that.
QUEUED_SLOT_WAIT = 8.0


@runtime_checkable
class AdmittingEvaluator(Protocol):
    """A rule evaluator that also answers at once whether it can evaluate now (routing.sandbox.SandboxPool)."""

    async def evaluate(
        self,
        rules: list[dict[str, Any]],
        params: dict[str, Any] | None,
        envelope: dict[str, Any],
        *,
        wait: float | None = None,
    ) -> Evaluation:
        """Evaluate, waiting up to ``wait`` for a slot."""
        ...

    async def evaluate_if_free(
        self, rules: list[dict[str, Any]], params: dict[str, Any] | None, envelope: dict[str, Any]
    ) -> Evaluation | None:
        """Evaluate if a slot is free and nobody waits for one, else None at once."""
        ...


def _fault_line(fault: dict[str, object]) -> str:
    """``rule index 2 (id "rl_…"): timeout`` for one fault on a trace; index -1 is the evaluation as a whole."""
    index, rule_id, cause = fault.get("rule_index"), fault.get("rule_id"), fault.get("cause")
    if not isinstance(index, int) or index == -1:
        return f"evaluation: {cause}"
    return f"{describe_rule(index, rule_id if isinstance(rule_id, str) else None, None)}: {cause}"


class RouteActivities:
    """Constructed once in the worker with the pool-backed stores and the sandbox pool."""

    def __init__(
        self,
        webhooks: WebhookStore,
        commits: CommitStore,
        sandbox: RuleEvaluator | None = None,
        *,
        commit_delay: float = 0.0,
        evaluate_delay: float = 0.0,
    ) -> None:
        self.webhooks = webhooks
        self.commits = commits
        self.sandbox = sandbox
        self.commit_delay = commit_delay
        self.evaluate_delay = evaluate_delay

    @activity.defn(name="load_grant")
    @application_errors
    async def load_grant(self, data: LoadGrantInput) -> LoadGrantResult:
        """The webhook's config, rules, params and live targets in target order."""
        try:
            grant = await self.webhooks.load_grant(data.webhook_id)
        except NotFound:
            record_delivery("unknown", "gone")  # the workflow ends here: this is the delivery's decision
            return LoadGrantResult(grant=None)
        if not grant.targets:
            record_delivery(grant.source, "no_targets")
        return LoadGrantResult(grant=grant)

    @activity.defn(name="evaluate_rules")
    @application_errors
    async def evaluate_rules(self, data: QueuedEvaluateInput) -> Evaluation:
        """The delivery's rules in the sandbox, on the fair evaluate queue, heartbeating so a dead worker is
        noticed in seconds."""
        if not data.rules:
            return Evaluation()
        sandbox = self.sandbox
        if sandbox is None:
            return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_failure", detail="no sandbox")])
        record_evaluation("queue")
        envelope = data.delivery.envelope(data.trusted_actors)
        if isinstance(sandbox, AdmittingEvaluator):
            # Admitted by Temporal already: wait out a fast-path evaluation holding the child, never fault.
            work = sandbox.evaluate(data.rules, data.params, envelope, wait=QUEUED_SLOT_WAIT)
        else:
            work = sandbox.evaluate(data.rules, data.params, envelope)
        task = asyncio.ensure_future(work)
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            activity.heartbeat()

    @activity.defn(name="evaluate_rules_if_free")
    @application_errors
    async def evaluate_rules_if_free(self, data: EvaluateHereInput) -> EvaluateHereResult:
        """RouteDelivery's fast path: evaluate on a free sandbox child of this worker, or answer "not admitted" at
        once. It never waits, so it takes only capacity nobody is waiting for; the run then uses the fair queue."""
        request = data.rules
        if not request.rules:
            return EvaluateHereResult(admitted=True, evaluation=Evaluation())
        sandbox = self.sandbox
        if not isinstance(sandbox, AdmittingEvaluator):
            return EvaluateHereResult(admitted=False)
        evaluation = await sandbox.evaluate_if_free(request.rules, request.params, request.envelope)
        if evaluation is None:
            return EvaluateHereResult(admitted=False)
        if self.evaluate_delay:
            # Fault injection for the kill -9 test only (SWITCHBOARD_FAULT_EVALUATE_DELAY); zero in production.
            activity.logger.warning("fault injection: holding the local evaluation %.0f s", self.evaluate_delay)
            await asyncio.sleep(self.evaluate_delay)
        record_evaluation("local")
        return EvaluateHereResult(admitted=True, evaluation=evaluation)

    @activity.defn(name="commit_delivery")
    @application_errors
    async def commit_delivery(self, data: CommitInput) -> CommitResult:
        """One transaction: event, once-claim, todos, doorbell. Idempotent under retries."""
        if self.commit_delay:
            # Fault injection for crash tests only (SWITCHBOARD_FAULT_COMMIT_DELAY); zero in production.
            await asyncio.sleep(self.commit_delay)
        # The run id comes from the activity's own context, so the workflow's input to it stays unchanged.
        result = await self.commits.commit(data.model_copy(update={"run_id": activity.info().workflow_run_id}))
        # Recorded here, not in the workflow (which replays): once per committed delivery, retries aside.
        faults = data.decision.trace.get("faults")
        record_delivery(
            data.delivery.source,
            "duplicate" if result.duplicate else result.disposition,
            faults if isinstance(faults, list) else (),
        )
        if not result.duplicate:
            record_triage_decision(data.decision.trace.get("llm"))
            if isinstance(faults, list) and faults:
                # Which rules faulted and why, never the detail: a jq error message may quote the payload.
                activity.logger.warning(
                    "rule faults on event %s: %s",
                    result.event_id,
                    "; ".join(_fault_line(f) for f in faults if isinstance(f, dict)),
                )
        # The SDK logger: the line carries the run and activity, and the request id (switchboard/request_ids.py).
        activity.logger.info(
            "delivery committed: %s%s, event %s, %d todo(s) created",
            result.disposition,
            " (duplicate)" if result.duplicate else "",
            result.event_id,
            result.created,
        )
        return result

    @activity.defn(name="commit_faulted")
    @application_errors
    async def commit_faulted(self, data: FaultCommitInput) -> CommitResult:
        """Store a delivery whose commit was refused as faulted, with the error on its trace. Idempotent."""
        result = await self.commits.commit_faulted(data)
        record_delivery(data.delivery.source, "faulted", data.faults)
        return result
