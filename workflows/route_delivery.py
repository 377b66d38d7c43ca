"""RouteDelivery: one verified delivery becomes an event and its todos, with a full history."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities.errors import STORE_REJECTED
    from activities.models import EvaluateHereInput, LoadGrantInput, QueuedEvaluateInput
    from activities.route import RouteActivities
    from activities.triage import TriageActivities
    from routing.delivery import CommitInput, CommitResult, DeliveryInput, FaultCommitInput
    from routing.models import EvaluateInput, Evaluation, Fault
    from routing.router import needs_envelope, route
    from routing.triage import TriageInput, TriageResult
    from workflows import explain, search

# Store activities are retried on transient errors (database restarts, pool timeouts) until PostgreSQL answers:
# an outage must not lose work. A refusal of the data (StoreRejected) is never retried; it ends as faulted.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=["ValidationError", STORE_REJECTED],
)
EVALUATE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)
# The fast path is one attempt: whatever goes wrong with it (it raised, it timed out) goes to the fair queue,
# whose activity has its own retries, so nothing is tried in two places at once.
LOCAL_TRY_RETRY = RetryPolicy(maximum_attempts=1)
# One attempt: a model call spends budget, and a failed or timed-out call is an outcome (the default decides).
TRIAGE_RETRY = RetryPolicy(maximum_attempts=1)
# The activity bounds its own call (the stage's timeout, capped by SWITCHBOARD_LLM_TIMEOUT_MAX_SECONDS); this
# covers the budget statement and a provider lookup around it. Unset stage timeout: the operator's cap applies.
TRIAGE_MARGIN = timedelta(seconds=15)
TRIAGE_DEFAULT_TIMEOUT = timedelta(seconds=60)
# Waiting for a worker to start it: a delivery must not wait in silence for a model it could route without.
TRIAGE_QUEUE_WAIT = timedelta(seconds=30)

# Rule evaluations that find no free sandbox child on the workflow's worker run on their own task queue, served
# in every worker process by a worker whose activity slots equal its sandbox children: a busy process leaves
# work queued in Temporal, handed out fairly across endpoints, instead of faulting it.
EVALUATE_QUEUE_SUFFIX = "-evaluate"


def evaluate_task_queue(task_queue: str) -> str:
    """The task queue rule evaluations of workflows on ``task_queue`` overflow to."""
    return task_queue + EVALUATE_QUEUE_SUFFIX


@workflow.defn(name="RouteDelivery")
class RouteDelivery:
    """Load the grant, evaluate rules, decide, commit; search attributes record the outcome."""

    @workflow.run
    async def run(self, delivery: DeliveryInput) -> CommitResult:
        self.delivery = delivery
        loaded = await workflow.execute_local_activity_method(
            RouteActivities.load_grant,
            LoadGrantInput(webhook_id=delivery.webhook_id),
            start_to_close_timeout=timedelta(seconds=10),
            summary=f"webhook {delivery.webhook_id}",
            retry_policy=STORE_RETRY,
        )
        grant = loaded.grant
        if grant is None:
            workflow.upsert_search_attributes([search.DECISION.value_set("gone"), *_sender(delivery)])
            return _explained(CommitResult(status="gone", verified=delivery.verified, trust_mode=delivery.trust_mode))
        if not grant.targets:
            workflow.upsert_search_attributes([search.DECISION.value_set("no_targets"), *_sender(delivery)])
            return _explained(
                CommitResult(status="no_targets", verified=delivery.verified, trust_mode=delivery.trust_mode)
            )

        # The one routing composition (routing.router): the trust gate, then its evaluate and triage steps are
        # activities, decide runs here. The envelope is built here, once, under the webhook's gate, and only when
        # routing reads it.
        self.trusted_actors = grant.trusted_actors
        envelope = delivery.envelope(grant.trusted_actors) if needs_envelope(grant) else None
        routed = await route(grant, envelope, self._evaluate, self._triage)
        decision = routed.decision

        try:
            result = await workflow.execute_local_activity_method(
                RouteActivities.commit_delivery,
                CommitInput(delivery=delivery, decision=decision, workflow_id=workflow.info().workflow_id),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=STORE_RETRY,
                summary=f"commit {decision.disposition}",
            )
        except (ActivityError, ApplicationError) as err:
            refused = _refusal(err)
            if refused is None:
                raise
            result = await self._commit_faulted(delivery, decision.trace.get("faults"), refused)
        outcome = result.disposition + (" duplicate" if result.duplicate else "")
        updates = [search.DECISION.value_set(outcome.replace(" ", "_")), *_sender(delivery)]
        if result.rule_id:
            updates.append(search.RULE_ID.value_set(result.rule_id))
        if result.event_id:
            updates.append(search.EVENT_ID.value_set(result.event_id))
        workflow.upsert_search_attributes(updates)
        # Not a command, and never written on replay: the run's one line, with its context and request id.
        workflow.logger.info("delivery decided: %s (rule %s)", outcome, result.rule_id)
        return _explained(result, decision.trace.get("faults"))

    async def _evaluate(self, rules: EvaluateInput) -> Evaluation:
        """The evaluate step: on a free sandbox child of this worker, else on the fair evaluate queue."""
        here = await self._evaluate_here(rules)
        if here is not None:
            return here
        return await self._evaluate_on_queue(rules)

    async def _evaluate_here(self, rules: EvaluateInput) -> Evaluation | None:
        """The verdict of this worker's free sandbox child, or None when none is free right now.

        A local activity: no task through matching, and its input (the envelope) is not recorded, only its small
        result in the marker. The sandbox still enforces every per-rule clock; a worker that dies here is noticed
        by the workflow task timeout, and the next worker replays and evaluates again.
        """
        try:
            here = await workflow.execute_local_activity_method(
                RouteActivities.evaluate_rules_if_free,
                EvaluateHereInput(rules=rules, endpoint_id=self.delivery.endpoint_id),
                start_to_close_timeout=timedelta(seconds=10),
                retry_policy=LOCAL_TRY_RETRY,
                summary=f"{_rules_summary(rules)} on this worker, if a sandbox child is free",
            )
        except (ActivityError, ApplicationError) as exc:
            if isinstance(exc.cause, CancelledError):
                raise
            workflow.logger.warning("local evaluation failed (%s); evaluating on the evaluate queue", exc)
            return None
        return here.evaluation if here.admitted and here.evaluation is not None else None

    async def _evaluate_on_queue(self, rules: EvaluateInput) -> Evaluation:
        """Evaluate on the evaluate task queue, fair across endpoints; a worker that never starts it is busy."""
        delivery = self.delivery
        try:
            return await workflow.execute_activity_method(
                RouteActivities.evaluate_rules,
                # The delivery, not the envelope: a regular activity's input is recorded, and the delivery's size is
                # bounded by the ingest cap, while an envelope re-serialized from a hostile body is not.
                QueuedEvaluateInput(
                    delivery=delivery, rules=rules.rules, params=rules.params, trusted_actors=self.trusted_actors
                ),
                task_queue=evaluate_task_queue(workflow.info().task_queue),
                # Waiting for a slot and running are bounded apart: a flood waits its turn (queueing), while a
                # worker that died mid-evaluation is still noticed by the heartbeat within seconds.
                schedule_to_start_timeout=timedelta(seconds=delivery.evaluate_queue_seconds),
                start_to_close_timeout=timedelta(seconds=10),
                heartbeat_timeout=timedelta(seconds=3),
                retry_policy=EVALUATE_RETRY,
                # The webhook's owning endpoint is the tenant: matching hands out evaluate tasks round-robin
                # across endpoints with queued work, so one endpoint's backlog cannot hold another's rules.
                priority=Priority(fairness_key=delivery.endpoint_id),
                summary=_rules_summary(rules) + " on the fair queue (no sandbox child was free)",
            )
        except ActivityError as exc:
            cause = exc.cause
            if isinstance(cause, CancelledError):
                raise
            if isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START:
                # No evaluate worker picked it up in time: a stuck or absent worker, a fault like any other
                # (on_fault "hold" holds it; "continue" takes no rule).
                wait = delivery.evaluate_queue_seconds
                detail = f"no evaluate worker started the rules within {wait:g} s"
                return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_busy", detail=detail)])
            # Every attempt lost its worker or failed: the delivery is still decided (and visible), as a fault.
            detail = f"evaluation failed after retries: {cause or exc}"[:200]
            return Evaluation(faults=[Fault(rule_index=-1, cause="sandbox_failure", detail=detail)])

    async def _triage(self, request: TriageInput) -> TriageResult:
        """The triage step: one attempt of the triage activity; its failure is an outcome, never the run's."""
        config = request.config
        stage_timeout = timedelta(seconds=config.timeout_seconds) if config.timeout_seconds else TRIAGE_DEFAULT_TIMEOUT
        try:
            return await workflow.execute_activity_method(
                TriageActivities.triage,
                request,
                schedule_to_start_timeout=TRIAGE_QUEUE_WAIT,
                start_to_close_timeout=stage_timeout + TRIAGE_MARGIN,
                retry_policy=TRIAGE_RETRY,
                summary=f"llm triage: {config.provider}/{config.model}"[:200],
            )
        except ActivityError as exc:
            cause = exc.cause
            if isinstance(cause, CancelledError):
                raise
            return TriageResult(
                outcome="llm_timeout" if isinstance(cause, ActivityTimeout) else "llm_error",
                provider=config.provider,
                model=config.model,
                detail=f"triage activity failed: {cause or exc}"[:200],
            )

    async def _commit_faulted(self, delivery: DeliveryInput, faults: object, refused: ApplicationError) -> CommitResult:
        """The commit was refused: store the event as faulted with the error; if even that is refused, just end."""
        details = list(refused.details)
        error_type = str(details[0]) if details else refused.type or "Error"
        message = str(details[1]) if len(details) > 1 else refused.message
        workflow.logger.warning("commit refused (%s: %s); storing the delivery as faulted", error_type, message)
        fault_input = FaultCommitInput(
            delivery=delivery,
            error_type=error_type,
            error_message=message,
            faults=faults if isinstance(faults, list) else [],
            workflow_id=workflow.info().workflow_id,
        )
        try:
            return await workflow.execute_local_activity_method(
                RouteActivities.commit_faulted,
                fault_input,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=STORE_RETRY,
                summary=f"store as faulted: {error_type}"[:200],
            )
        except (ActivityError, ApplicationError) as err:
            again = _refusal(err)
            if again is None:
                raise
            # Nothing of this delivery can be stored: the history, this log line and the search attribute are
            # its record, and the workflow ends instead of retrying a refusal forever.
            workflow.logger.error(
                "delivery %s could not be stored even as faulted: %s", delivery.external_id, again.message
            )
            return CommitResult(
                faulted=True, disposition="faulted", verified=delivery.verified, trust_mode=delivery.trust_mode
            )


def _rules_summary(rules: EvaluateInput) -> str:
    """The evaluate activity's line in the UI."""
    count = len(rules.rules)
    return f"{count} rule{'' if count == 1 else 's'}"


def _sender(delivery: DeliveryInput) -> list[SearchAttributeUpdate[str]]:
    """Who sent the delivery, upserted with the decision in the run's one upsert (the start sets none)."""
    updates = [search.WEBHOOK_ID.value_set(delivery.webhook_id), search.SOURCE.value_set(delivery.source)]
    if delivery.kind:
        updates.append(search.KIND.value_set(delivery.kind[: explain.MAX_ATTRIBUTE_CHARS]))
    if delivery.producer_delivery_id and len(delivery.producer_delivery_id) <= explain.MAX_ATTRIBUTE_CHARS:
        updates.append(search.DELIVERY_ID.value_set(delivery.producer_delivery_id))
    return updates


def _explained(result: CommitResult, faults: object = None) -> CommitResult:
    """Set the run's current details (decision, rule, event, todos, faults) for the UI; returns ``result``.

    Current details are answered from the workflow's state to the UI's metadata query, never recorded as a
    command, so they replay on any history.
    """
    workflow.set_current_details(explain.end_details(result, faults))
    return result


def _refusal(err: BaseException) -> ApplicationError | None:
    """The store's deterministic refusal behind an activity failure, if that is what it was."""
    # A regular activity's failure arrives as ActivityError(cause=ApplicationError); a local activity's as the
    # ApplicationError itself. Either way the activity's own ApplicationError carries the type.
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ApplicationError) and seen.type == STORE_REJECTED:
            return seen
        seen = seen.cause if isinstance(seen, ActivityError | ApplicationError) else None
    return None
