"""Activities of RouteDelivery: thin wrappers over the store and the sandbox."""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.errors import application_errors
from activities.models import LoadGrantInput, LoadGrantResult
from routing.delivery import CommitInput, CommitResult, FaultCommitInput
from routing.models import EvaluateInput, Evaluation, Fault
from routing.router import RuleEvaluator, evaluator
from store.deliveries import DeliveryStore
from store.errors import NotFound
from store.webhooks import WebhookStore
from switchboard.metrics import record_delivery, record_triage_decision


class RouteActivities:
    """Constructed once in the worker with the pool-backed stores and the sandbox pool."""

    def __init__(
        self,
        webhooks: WebhookStore,
        deliveries: DeliveryStore,
        sandbox: RuleEvaluator | None = None,
        *,
        commit_delay: float = 0.0,
    ) -> None:
        self.webhooks = webhooks
        self.deliveries = deliveries
        self.sandbox = sandbox
        self.commit_delay = commit_delay

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
    async def evaluate_rules(self, data: EvaluateInput) -> Evaluation:
        """The router's evaluate step in the sandbox, heartbeating so a dead worker is noticed in seconds."""
        if not data.rules:
            return Evaluation()
        if self.sandbox is None:
            return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_failure", detail="no sandbox")])
        task = asyncio.ensure_future(evaluator(self.sandbox)(data))
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                break
            if not activity.info().is_local:
                activity.heartbeat()
        return task.result()

    @activity.defn(name="commit_delivery")
    @application_errors
    async def commit_delivery(self, data: CommitInput) -> CommitResult:
        """One transaction: event, once-claim, todos, doorbell. Idempotent under retries."""
        if self.commit_delay:
            # Fault injection for crash tests only (SWITCHBOARD_FAULT_COMMIT_DELAY); zero in production.
            await asyncio.sleep(self.commit_delay)
        # The run id comes from the activity's own context, so the workflow's input to it stays unchanged.
        result = await self.deliveries.commit(data.model_copy(update={"run_id": activity.info().workflow_run_id}))
        # Recorded here, not in the workflow (which replays): once per committed delivery, retries aside.
        faults = data.decision.trace.get("faults")
        record_delivery(
            data.delivery.source,
            "duplicate" if result.duplicate else result.disposition,
            faults if isinstance(faults, list) else (),
        )
        if not result.duplicate:
            record_triage_decision(data.decision.trace.get("llm"))
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
        result = await self.deliveries.commit_faulted(data)
        record_delivery(data.delivery.source, "faulted", data.faults)
        return result
