"""RouteDelivery: one verified delivery becomes an event and its todos, with a full history."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.models import EvaluateInput, LoadGrantInput
    from activities.route import STORE_REJECTED, RouteActivities
    from routing.decision import decide
    from routing.delivery import CommitInput, CommitResult, DeliveryInput, FaultCommitInput
    from routing.models import Evaluation
    from workflows import search

# Store activities are retried on transient errors (database restarts, pool timeouts) until PostgreSQL answers:
# an outage must not lose work. A refusal of the data (StoreRejected) is never retried; it ends as faulted.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=["ValidationError", STORE_REJECTED],
)
# Marks the code path that ends a refused commit as faulted (histories before it never reach that branch).
COMMIT_FAULT_PATCH = "commit-refused-ends-faulted"
EVALUATE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)


def workflow_id_for(webhook_id: str, external_id: str) -> str:
    """Deterministic workflow id, so concurrent redeliveries join one run."""
    import hashlib

    digest = hashlib.sha256(external_id.encode()).hexdigest()[:40]
    return f"delivery-{webhook_id}-{digest}"


@workflow.defn(name="RouteDelivery")
class RouteDelivery:
    """Load the grant, evaluate rules, decide, commit; search attributes record the outcome."""

    @workflow.run
    async def run(self, delivery: DeliveryInput) -> CommitResult:
        loaded = await workflow.execute_local_activity_method(
            RouteActivities.load_grant,
            LoadGrantInput(webhook_id=delivery.webhook_id),
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=STORE_RETRY,
        )
        grant = loaded.grant
        if grant is None:
            workflow.upsert_search_attributes([search.DECISION.value_set("gone")])
            return CommitResult(status="gone", verified=delivery.verified, trust_mode=delivery.trust_mode)
        if not grant.targets:
            workflow.upsert_search_attributes([search.DECISION.value_set("no_targets")])
            return CommitResult(status="no_targets", verified=delivery.verified, trust_mode=delivery.trust_mode)

        evaluation = Evaluation()
        # Only rules and a configured default (once / coalesce / work order read the subject) need the envelope;
        # a webhook with neither routes to its target queue without parsing the body here.
        envelope = delivery.envelope() if grant.rules or grant.default_action else None
        if grant.rules:
            assert envelope is not None
            rules = EvaluateInput(rules=grant.rules, params=grant.params, envelope=envelope)
            if delivery.evaluate_locally:
                evaluation = await workflow.execute_local_activity_method(
                    RouteActivities.evaluate_rules,
                    rules,
                    start_to_close_timeout=timedelta(seconds=10),
                    retry_policy=EVALUATE_RETRY,
                )
            else:
                evaluation = await workflow.execute_activity_method(
                    RouteActivities.evaluate_rules,
                    rules,
                    start_to_close_timeout=timedelta(seconds=10),
                    heartbeat_timeout=timedelta(seconds=3),
                    retry_policy=EVALUATE_RETRY,
                )
        decision = decide(grant, evaluation, envelope)

        try:
            result = await workflow.execute_local_activity_method(
                RouteActivities.commit_delivery,
                CommitInput(delivery=delivery, decision=decision, workflow_id=workflow.info().workflow_id),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=STORE_RETRY,
            )
        except (ActivityError, ApplicationError) as err:
            refused = _refusal(err)
            if refused is None or not workflow.patched(COMMIT_FAULT_PATCH):
                raise
            result = await self._commit_faulted(delivery, decision.trace.get("faults"), refused)
        outcome = result.disposition + (" duplicate" if result.duplicate else "")
        updates = [search.DECISION.value_set(outcome.replace(" ", "_"))]
        if result.rule_id:
            updates.append(search.RULE_ID.value_set(result.rule_id))
        workflow.upsert_search_attributes(updates)
        return result

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
