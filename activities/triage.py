"""The LLM triage activity of RouteDelivery: take budget, make one bounded model call, report what happened.

It never raises for the model's sake: a spent budget, a timeout or a failed call is an outcome the workflow
records (the default decides, with that cause). It runs as a regular activity with one attempt
(RouteDelivery), so a model call is never repeated blindly, and its result is in the history, so a replay
never calls the model again. The answer is not judged here: routing.triage does that inside the workflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.errors import application_errors
from routing.triage import (
    SCHEMA_NAME,
    TriageInput,
    TriageOutcome,
    TriageResult,
    answer_schema,
    instructions,
    request_data,
)
from store.llm import Ceilings, LlmStore
from switchboard.llm import LlmError, chat_json
from switchboard.metrics import record_triage_call

# {queue, confidence, reason} with a reason of at most REASON_MAX_CHARS: well under this many tokens.
ANSWER_MAX_TOKENS = 160


class TriageActivities:
    """Constructed once in the worker with the LLM store and the operator's ceilings (read at each run)."""

    def __init__(self, llm: LlmStore, ceilings: Callable[[], Ceilings]) -> None:
        self.llm = llm
        self.ceilings = ceilings

    @activity.defn(name="llm_triage")
    @application_errors
    async def triage(self, data: TriageInput) -> TriageResult:
        """Ask the configured provider for {queue, confidence, reason} within budget and timeout."""
        config = data.config
        result = await ask_model(self.llm, self.ceilings(), data)
        record_triage_call(
            config.provider, result.outcome, None if result.latency_ms is None else result.latency_ms / 1000
        )
        return result


async def ask_model(
    llm: LlmStore, ceilings: Ceilings, data: TriageInput, *, within: float | None = None
) -> TriageResult:
    """One triage call as a delivery makes it: budget taken first, then one bounded call; never raises for the
    model's sake. ``within`` caps the call's timeout further (a preview's time left)."""
    config = data.config

    def outcome(kind: TriageOutcome, **more: Any) -> TriageResult:
        return TriageResult(outcome=kind, provider=config.provider, model=config.model, **more)

    provider = await llm.provider(config.provider)
    if provider is None:
        # Deleted by the operator (egress cut off), or its key no longer opens: no call, the default decides.
        return outcome("llm_error", detail=f"provider {config.provider} is not available")
    # Budget before the call and never refunded: a call that fails has still been made.
    exhausted = await llm.take_budget(
        data.endpoint_id,
        data.webhook_id,
        per_minute=config.per_minute,
        per_day=config.per_day,
        ceilings=ceilings,
    )
    if exhausted is not None:
        return outcome("budget_exhausted", detail=f"{exhausted} budget spent")
    timeout = min(config.timeout_seconds or provider.timeout_seconds, ceilings.timeout_seconds)
    if within is not None:
        timeout = min(timeout, within)
    started = time.monotonic()
    try:
        answer = await chat_json(
            provider,
            config.model,
            instructions=instructions(config),
            data=request_data(data),
            schema=answer_schema(config),
            schema_name=SCHEMA_NAME,
            timeout_seconds=timeout,
            max_tokens=ANSWER_MAX_TOKENS,
        )
    except LlmError as exc:
        latency = int((time.monotonic() - started) * 1000)
        return outcome(exc.cause, detail=exc.message, latency_ms=latency)
    latency = int((time.monotonic() - started) * 1000)
    return outcome("answered", answer=answer, latency_ms=latency)
