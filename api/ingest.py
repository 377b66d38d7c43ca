"""The receiver: POST /webhooks/w/{ingest_token}. Verifies, derives the idempotency key, starts RouteDelivery."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from temporalio.client import WorkflowFailureError
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from api.deps import services
from api.ratelimit import retry_after
from routing.collectors import BrokenCollectorConfig, delivery_kind, stored_collector_config
from routing.delivery import CommitResult, DeliveryInput
from routing.envelope import parse_payload
from routing.headers import lower_headers, sanitize_headers
from routing.models import RESERVED_SOURCES
from routing.signatures import SOURCE_TYPES, MissingSecret, delivery_id, verify
from routing.text import MAX_HEADER_VALUE_CHARS, clean_optional
from workflows import search
from workflows.route_delivery import RouteDelivery, workflow_id_for

log = logging.getLogger("switchboard.ingest")

router = APIRouter(tags=["ingest"])
_TOKEN = re.compile(r"^[0-9a-f]{32}$")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _read_capped(request: Request, cap: int) -> bytes | None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/webhooks/w/{ingest_token}",
    status_code=202,
    summary="Receive a webhook delivery.",
    responses={401: {}, 404: {}, 413: {}, 429: {}, 503: {}},
)
async def ingest(ingest_token: str, request: Request) -> JSONResponse:
    svc = services(request)
    settings = svc.settings
    client_ip = request.client.host if request.client else "unknown"
    wait = svc.ingest_limits.take(client_ip)
    if wait:
        return _error(429, "rate limit exceeded", {"Retry-After": retry_after(wait)})
    body = await _read_capped(request, settings.ingest_body_max)
    if body is None:
        return _error(413, "payload too large")
    if not _TOKEN.match(ingest_token):
        return _error(404, "unknown webhook")
    webhook = await svc.webhooks.get_for_ingest(ingest_token)
    if webhook is None or webhook.source_type in RESERVED_SOURCES:
        return _error(404, "unknown webhook")
    if webhook.source_type not in SOURCE_TYPES:
        # A stored source type this build does not know how to verify: refuse, never accept unverified.
        log.error("webhook source type is unknown", extra={"webhook_id": webhook.id})
        return _error(503, "webhook configuration is unreadable; nothing was accepted")

    raw_headers = list(request.headers.items())
    headers = lower_headers(raw_headers)
    try:
        # Fail closed: a stored collector configuration that does not parse may have required an HMAC.
        collector = stored_collector_config(webhook.config) if webhook.source_type == "generic" else None
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
        log.warning("delivery rejected", extra={"webhook_id": webhook.id, "detail": verification.detail})
        return _error(401, "signature verification failed")

    payload = parse_payload(body)
    if webhook.source_type == "slack" and _is_url_verification(payload):
        # Slack's endpoint handshake (signed like any delivery): answer the challenge, mint nothing.
        return JSONResponse({"challenge": payload["challenge"]}, status_code=200)

    external_id = f"{webhook.id}:{delivery_id(webhook.source_type, headers, body)}"
    kind = delivery_kind(webhook.source_type, webhook.config, headers, payload)
    delivery = DeliveryInput(
        webhook_id=webhook.id,
        endpoint_id=webhook.endpoint_id,
        source=webhook.source_type,
        kind=kind,
        external_id=external_id,
        trust_mode=webhook.trust_mode,
        verified=verification.verified,
        verify_detail=verification.detail,
        content_type=clean_optional(request.headers.get("content-type"), MAX_HEADER_VALUE_CHARS),
        headers=sanitize_headers(raw_headers),
        body_b64=base64.b64encode(body).decode(),
        source_ip=client_ip,
        received_at=datetime.now(UTC).isoformat(),
        evaluate_locally=settings.evaluate_locally,
    )
    return await start_and_wait(request, delivery)


def _is_url_verification(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and payload.get("type") == "url_verification"
        and isinstance(payload.get("challenge"), str)
    )


async def start_and_wait(request: Request, delivery: DeliveryInput) -> JSONResponse:
    """Start (or join) the delivery's workflow and answer with its result, or pending when slow."""
    svc = services(request)
    settings = svc.settings
    if svc.temporal is None:
        return _error(503, "routing is unavailable, retry later")
    workflow_id = workflow_id_for(delivery.webhook_id, delivery.external_id)
    attrs: list[Any] = [
        SearchAttributePair(search.WEBHOOK_ID, delivery.webhook_id),
        SearchAttributePair(search.SOURCE, delivery.source),
    ]
    if delivery.kind:
        attrs.append(SearchAttributePair(search.KIND, delivery.kind[:256]))
    try:
        handle = await svc.temporal.start_workflow(
            RouteDelivery.run,
            delivery,
            id=workflow_id,
            task_queue=settings.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes(attrs),
            rpc_timeout=timedelta(seconds=5),
            # Taken only when this process also hosts a worker on the task queue (switchboard dev / api).
            request_eager_start=settings.eager_start,
        )
    except Exception:
        # Nothing was written: the producer's retry is the recovery.
        log.exception("could not start RouteDelivery")
        return _error(503, "routing is unavailable, retry later")
    try:
        result = await asyncio.wait_for(handle.result(), timeout=settings.ingest_wait_seconds)
    except TimeoutError:
        return JSONResponse({"accepted": True, "pending": True, "workflow_id": workflow_id}, status_code=202)
    except WorkflowFailureError:
        log.exception("RouteDelivery failed", extra={"workflow_id": workflow_id})
        return _error(500, "delivery could not be routed")
    except Exception:
        log.exception("lost contact with Temporal while waiting", extra={"workflow_id": workflow_id})
        return JSONResponse({"accepted": True, "pending": True, "workflow_id": workflow_id}, status_code=202)
    assert isinstance(result, CommitResult)
    if result.status == "gone":
        return _error(404, "unknown webhook")
    if result.status == "no_targets":
        return _error(503, "webhook has no live delivery target")
    return JSONResponse(result.response_body(), status_code=202)
