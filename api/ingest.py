"""The receiver: POST /webhooks/w/{ingest_token}. Verifies, derives the idempotency key, starts RouteDelivery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect
from temporalio.client import Client, WorkflowFailureError

from api.admission import Admission
from api.bodies import read_capped
from api.deps import ServicesDep
from api.ratelimit import TokenBuckets, retry_after
from routing.collectors import BrokenCollectorConfig, delivery_kind, stored_collector_config
from routing.delivery import (
    TEMPORAL_PAYLOAD_LIMIT,
    CommitResult,
    DeliveryAnswer,
    DeliveryInput,
    max_input_bytes,
    summary_line,
)
from routing.envelope import parse_payload
from routing.headers import lower_headers, sanitize_headers
from routing.signatures import MissingSecret
from routing.sources import body_fallback_id, find_source, ingest_wait_seconds, producer_delivery_id, verify
from routing.text import MAX_HEADER_VALUE_CHARS, clean_optional
from runtime.starts import is_outage, start_delivery, start_refusal
from store.commits import CommitStore
from store.db import bounded
from store.errors import StoreUnavailable
from store.inbox import InboxReason, InboxStore
from store.models import IngestWebhook
from store.webhooks import WebhookStore
from switchboard.metrics import record_ingest
from switchboard.settings import Settings

log = logging.getLogger("switchboard.ingest")

router = APIRouter(tags=["ingest"])
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
# The access line's and the metric's status of a delivery whose producer left before its body was whole (nginx's).
CLIENT_CLOSED = 499
# PostgreSQL unreachable, or too slow to answer inside the producer's window.
_UNAVAILABLE = (TimeoutError, StoreUnavailable)


def check_body_cap(settings: Settings) -> None:
    """Refuse to start with an ingest cap whose deliveries would not fit Temporal's payload limit: an accepted
    delivery must always be routable."""
    needed = max_input_bytes(settings.ingest_body_max)
    if needed > TEMPORAL_PAYLOAD_LIMIT:
        largest = 3 * (TEMPORAL_PAYLOAD_LIMIT - max_input_bytes(0)) // 4
        raise ValueError(
            f"SWITCHBOARD_INGEST_BODY_MAX={settings.ingest_body_max}: a delivery that large travels to its workflow "
            f"as {needed} bytes, over Temporal's {TEMPORAL_PAYLOAD_LIMIT}-byte payload limit; at most {largest} fits"
        )


def _database_bound(settings: Settings) -> contextlib.AbstractAsyncContextManager[None]:
    """The bound on one database step of ingest: with PostgreSQL down or hung, 503 within about the pool timeout
    (inside a producer's window), never after psycopg's own cancellation waits."""
    return bounded(settings.db_pool_timeout + 0.25)


class PendingAnswer(BaseModel):
    """The producer's 202 when the route is not decided inside its window: the delivery is durable and is routed
    exactly once later, with no redelivery needed."""

    model_config = ConfigDict(extra="forbid")

    accepted: Literal[True] = Field(description="always true: the delivery is taken")
    pending: Literal[True] = Field(description="always true: not routed yet")
    workflow_id: str = Field(description="its RouteDelivery workflow (delivery-wh_…), to find it in the Temporal UI")


class ChallengeAnswer(BaseModel):
    """The 200 of Slack's `url_verification` handshake (signed like any delivery); nothing is routed."""

    model_config = ConfigDict(extra="forbid")

    challenge: str = Field(description="the challenge Slack sent, echoed")


class IngestError(BaseModel):
    """Every refusal at ingest (the agent verbs' errors carry a code; a producer gets the message)."""

    model_config = ConfigDict(extra="forbid")

    error: str = Field(description="what was refused and why; nothing was accepted")


RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ChallengeAnswer, "description": "Slack's url_verification handshake, answered"},
    202: {
        "model": DeliveryAnswer | PendingAnswer,
        "description": "accepted: routed (todos made or found; dropped, repeat, faulted or quarantined), or pending",
    },
    401: {"model": IngestError, "description": "signature missing or wrong; nothing stored"},
    404: {"model": IngestError, "description": "unknown webhook; nothing stored"},
    413: {"model": IngestError, "description": "body over SWITCHBOARD_INGEST_BODY_MAX"},
    429: {
        "model": IngestError,
        "description": "this address's failed requests emptied its bucket (Retry-After); never a verified delivery",
    },
    500: {"model": IngestError, "description": "the delivery's workflow failed"},
    503: {
        "model": IngestError,
        "description": "neither Temporal nor PostgreSQL can take it, no live target, or an unreadable verification"
        " setting; nothing accepted, retry later",
    },
}
"""Every answer of the ingest route, for OpenAPI."""

TOKEN_PARAMETER = {
    "name": "ingest_token",
    "in": "path",
    "required": True,
    "description": "the webhook's ingest token (32 hex characters, from create_webhook's ingest_url)",
    "schema": {"type": "string"},
}
"""The path parameter, for OpenAPI: the route reads it raw, so a malformed token meets the refusal of an unknown one
(404, charged to the address's bucket) rather than a validation error."""


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(IngestError(error=message).model_dump(), status_code=status, headers=headers)


class _AddressGate:
    """The per-address bucket at ingest: it is charged only by refusals, and never refuses a verified delivery.

    Every request that fails before or at verification (oversized body, malformed or unknown token, bad or
    missing signature) spends one token of its client address's bucket; a verified delivery spends nothing.
    An address whose bucket is empty (throttled) is refused with 429 + Retry-After instead of 404/401, checked
    without spending, at the cheapest point: a malformed token before any lookup, an unknown token right after
    the one indexed lookup, before any HMAC. A throttled address with a real token still gets its signature
    checked (one HMAC over at most the body cap, the same work as reading the body) and a correctly signed
    delivery is accepted as usual: GitHub sends every organisation's hooks from a few shared addresses, and
    GitHub never redelivers. So a flood costs us at most one body read, one lookup and one HMAC per request
    (bounded by the body cap), and while throttled it learns nothing: existing and unknown tokens, bad
    signatures and guesses all answer the same 429.
    """

    def __init__(self, buckets: TokenBuckets, address: str) -> None:
        self.buckets = buckets
        self.address = address
        self.throttled = buckets.wait(address)

    def refuse(self, status: int, message: str) -> JSONResponse:
        """Charge the address for a failed request; while it is throttled the answer is 429 whatever the cause."""
        self.buckets.spend(self.address)
        if self.throttled:
            return _error(429, "rate limit exceeded", {"Retry-After": retry_after(self.throttled)})
        return _error(status, message)


@router.post(
    "/webhooks/w/{ingest_token}",
    status_code=202,
    response_model=None,
    summary="Receive a webhook delivery.",
    operation_id="ingest",
    responses=RESPONSES,
    openapi_extra={"parameters": [TOKEN_PARAMETER]},
)
async def ingest(request: Request, svc: ServicesDep) -> Response:
    ingest_token: str = request.path_params["ingest_token"]
    # One dependency, not one per service: FastAPI solves every dependency of this hot path on every request.
    started = time.perf_counter()
    status = 500  # an exception escaping the handler is answered 500 by the error handlers
    try:
        try:
            response: Response = await _receive(
                ingest_token,
                request,
                settings=svc.settings,
                webhooks=svc.webhooks,
                buckets=svc.ingest_limits,
                inbox=svc.inbox,
                commits=svc.commits,
                admission=svc.admission,
                temporal=svc.temporal,
            )
        except ClientDisconnect:
            # The producer left (or was cut off for sending too slowly) before its body was whole: nothing was
            # verified or written, and nobody is there to answer. Its own status, nginx's 499, in the access line
            # and the metric: not a failure of ours (no 5xx, no traceback).
            log.warning("producer disconnected before its body was whole; nothing accepted")
            response = Response(status_code=CLIENT_CLOSED)
        status = response.status_code
        return response
    finally:
        # The webhook's source type once its token resolved to a known one (_receive sets it), else "unknown".
        record_ingest(getattr(request.state, "ingest_source", None), status, time.perf_counter() - started)


async def _receive(
    ingest_token: str,
    request: Request,
    *,
    settings: Settings,
    webhooks: WebhookStore,
    buckets: TokenBuckets,
    inbox: InboxStore,
    commits: CommitStore,
    admission: Admission,
    temporal: Client | None,
) -> JSONResponse:
    # The real client address (api/clientaddr.py resolved X-Forwarded-For from trusted proxies only).
    client_ip = request.client.host if request.client else "unknown"
    gate = _AddressGate(buckets, client_ip)
    body = await read_capped(request.receive, request.scope.get("headers", []), settings.ingest_body_max)
    if body is None:
        gate.buckets.spend(client_ip)
        # Connection: close, so a client that sent more than we drained is not read as the next request.
        return _error(413, "payload too large", {"Connection": "close"})
    if not _TOKEN.match(ingest_token):
        return gate.refuse(404, "unknown webhook")
    try:
        webhook = await _lookup(webhooks, settings, ingest_token)
    except _UNAVAILABLE:
        return _error(503, "storage is unavailable, retry later")
    source_row = find_source(webhook.source_type) if webhook is not None else None
    if webhook is None or (source_row is not None and source_row.reserved):
        return gate.refuse(404, "unknown webhook")
    if source_row is None:
        # A stored source type this build does not know how to verify: refuse, never accept unverified.
        log.error("webhook source type is unknown", extra={"webhook_id": webhook.id})
        return _error(503, "webhook configuration is unreadable; nothing was accepted")
    request.state.ingest_source = webhook.source_type

    raw_headers = list(request.headers.items())
    headers = lower_headers(raw_headers)
    try:
        # Fail closed: a stored collector configuration that does not parse may have required an HMAC.
        collector = stored_collector_config(webhook.config) if source_row.collector else None
    except BrokenCollectorConfig:
        log.error("webhook collector configuration does not parse", extra={"webhook_id": webhook.id})
        return _error(503, "webhook configuration is unreadable; nothing was accepted")
    generic_hmac = collector.hmac.scheme() if collector is not None and collector.hmac is not None else None
    secret = webhook.collector_secret if generic_hmac is not None else webhook.secret
    unreadable = webhook.collector_secret_unreadable if generic_hmac is not None else webhook.secret_unreadable
    if unreadable:
        log.error("webhook secret does not decrypt", extra={"webhook_id": webhook.id})
        return _error(503, "webhook is not ready to verify deliveries")
    try:
        verification = verify(
            webhook.source_type,
            secret.encode() if secret else None,
            headers,
            body,
            time.time(),
            generic_hmac=generic_hmac,
        )
    except MissingSecret:
        return _error(503, "webhook is not ready to verify deliveries")
    if not verification.ok:
        if not gate.throttled:  # a throttled flood is not logged line by line
            log.warning("delivery rejected", extra={"webhook_id": webhook.id, "detail": verification.detail})
        return gate.refuse(401, "signature verification failed")

    payload = parse_payload(body)
    if source_row.url_verification and _is_url_verification(payload):
        # Slack's endpoint handshake (signed like any delivery): answer the challenge, mint nothing.
        return JSONResponse(ChallengeAnswer(challenge=payload["challenge"]).model_dump(), status_code=200)

    # Parsed once, here: the producer's delivery id, the kind and the UI's summary line come from this value.
    producer_id = producer_delivery_id(webhook.source_type, headers, payload)
    kind = delivery_kind(webhook.source_type, webhook.config, headers, payload)
    delivery = DeliveryInput(
        webhook_id=webhook.id,
        endpoint_id=webhook.endpoint_id,
        source=webhook.source_type,
        kind=kind,
        external_id=f"{webhook.id}:{producer_id or body_fallback_id(body)}",
        trust_mode=webhook.trust_mode,
        verified=verification.verified,
        verify_detail=verification.detail,
        content_type=clean_optional(request.headers.get("content-type"), MAX_HEADER_VALUE_CHARS),
        headers=sanitize_headers(raw_headers),
        body=body,
        source_ip=client_ip,
        received_at=datetime.now(UTC).isoformat(),
        summary=summary_line(webhook.source_type, kind, payload),
        evaluate_queue_seconds=settings.evaluate_queue_seconds,
        producer_delivery_id=producer_id,
    )
    return await start_and_wait(
        delivery,
        settings=settings,
        inbox=inbox,
        commits=commits,
        admission=admission,
        temporal=temporal,
        rate=webhook_rate(webhook, settings),
    )


def _is_url_verification(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and payload.get("type") == "url_verification"
        and isinstance(payload.get("challenge"), str)
    )


async def _lookup(webhooks: WebhookStore, settings: Settings, token: str) -> IngestWebhook | None:
    # Bounded: with PostgreSQL down the producer hears 503 within about the pool timeout, not after a hang.
    async with _database_bound(settings):
        return await webhooks.get_for_ingest(token)


def _pending(workflow_id: str) -> JSONResponse:
    return JSONResponse(
        PendingAnswer(accepted=True, pending=True, workflow_id=workflow_id).model_dump(), status_code=202
    )


def webhook_rate(webhook: IngestWebhook, settings: Settings) -> float:
    """The webhook's pace in deliveries/s (0 = unpaced): its own override, else the operator default."""
    rate = webhook.rate_per_second if webhook.rate_per_second is not None else settings.webhook_rate_per_second
    return max(rate, 0.0)


async def _to_inbox(
    inbox: InboxStore, settings: Settings, workflow_id: str, delivery: DeliveryInput, reason: InboxReason
) -> JSONResponse:
    """Accept into the PostgreSQL inbox (one statement); 503 only when PostgreSQL cannot take it either."""
    try:
        async with _database_bound(settings):
            fresh = await inbox.put(workflow_id, delivery, reason)
    except _UNAVAILABLE:
        log.exception("neither Temporal nor PostgreSQL could take a delivery", extra={"workflow_id": workflow_id})
        return _error(503, "routing is unavailable, retry later")
    log.info(
        "delivery accepted into the inbox",
        extra={"workflow_id": workflow_id, "webhook_id": delivery.webhook_id, "reason": reason, "fresh": fresh},
    )
    return _pending(workflow_id)


async def start_and_wait(
    delivery: DeliveryInput,
    *,
    settings: Settings,
    inbox: InboxStore,
    commits: CommitStore,
    admission: Admission,
    temporal: Client | None,
    rate: float = 0.0,
) -> JSONResponse:
    """Start (or join) the delivery's workflow and answer inside the producer's window: its result, or pending.

    Accept first: when Temporal does not take the start in time, when this process is past its capacity, or
    when the webhook's pace defers the delivery, it is written to the inbox and answered `202 pending`; a relay
    starts it later under the same workflow id. A start Temporal refuses (not an outage) is stored as a faulted
    event at once: retrying it could never succeed.
    """
    deadline = time.monotonic() + ingest_wait_seconds(delivery.source, settings.ingest_wait_seconds)
    workflow_id = delivery.workflow_id
    if rate > 0:
        try:
            async with _database_bound(settings):
                deferred = await inbox.pace(workflow_id, delivery, rate=rate, burst=settings.webhook_rate_burst)
        except _UNAVAILABLE:
            return _error(503, "routing is unavailable, retry later")
        if deferred:
            log.info("delivery paced into the inbox", extra={"workflow_id": workflow_id, "rate": rate})
            return _pending(workflow_id)
    reason = admission.diversion() if temporal is not None else "temporal_unavailable"
    if reason is not None:
        return await _to_inbox(inbox, settings, workflow_id, delivery, reason)
    assert temporal is not None
    with admission.slot():
        try:
            async with asyncio.timeout(
                max(min(settings.temporal_start_timeout_seconds, deadline - time.monotonic()), 0)
            ):
                handle, started = await start_delivery(temporal, delivery, settings)
        except Exception as exc:
            if not is_outage(exc):
                return await _refused(commits, inbox, settings, delivery, exc)
            # Possibly taken after all (a frozen server answers late): the relay's start then joins that run.
            admission.start_failed()
            log.warning(
                "Temporal did not take the start in time",
                extra={"workflow_id": workflow_id, "error": f"{type(exc).__name__}: {exc}"[:300]},
            )
            return await _to_inbox(inbox, settings, workflow_id, delivery, "temporal_unavailable")
        admission.start_ok()
        try:
            result = await asyncio.wait_for(handle.result(), timeout=max(deadline - time.monotonic(), 0))
        except TimeoutError:
            return _pending(workflow_id)
        except WorkflowFailureError:
            log.exception("RouteDelivery failed", extra={"workflow_id": workflow_id})
            return _error(500, "delivery could not be routed")
        except Exception:
            log.exception("lost contact with Temporal while waiting", extra={"workflow_id": workflow_id})
            return _pending(workflow_id)
    assert isinstance(result, CommitResult)
    if result.status == "gone":
        return _error(404, "unknown webhook")
    if result.status == "no_targets":
        return _error(503, "webhook has no live delivery target")
    # Only the call whose start created the run reports what it created; joiners are redeliveries.
    return JSONResponse((result if started else result.joined()).response_body(), status_code=202)


async def _refused(
    commits: CommitStore, inbox: InboxStore, settings: Settings, delivery: DeliveryInput, exc: BaseException
) -> JSONResponse:
    """Temporal refused the start itself: store the delivery as a faulted event with the error, and answer 202."""
    error = start_refusal(delivery, exc)
    log.error(
        "Temporal refused a delivery's start; stored as faulted",
        extra={"workflow_id": delivery.workflow_id, "error": error.error_message},
    )
    try:
        async with _database_bound(settings):
            result = await commits.commit_faulted(error)
    except _UNAVAILABLE:
        # The inbox's relay meets the same refusal and stores the faulted event once PostgreSQL answers.
        return await _to_inbox(inbox, settings, delivery.workflow_id, delivery, "temporal_unavailable")
    return JSONResponse(result.response_body(), status_code=202)
