"""Typed rows returned by the store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class Caller(BaseModel):
    """The endpoint a bearer credential resolved to, with its immutable scope."""

    endpoint_id: str
    agent_id: str
    human_id: str
    scope_queues: list[str]
    scope_verbs: list[str]
    webhook_max: int
    webhook_source_types: list[str]
    webhook_queues: list[str]


class Webhook(BaseModel):
    """A webhook's metadata (never its secret)."""

    id: str
    endpoint_id: str
    source_type: str
    target_queue: str
    trust_mode: str
    ingest_token: str
    state: str
    created_at: datetime
    updated_at: datetime
    routing_rules: list[dict[str, Any]] = []
    routing_default_action: dict[str, Any] | None = None
    routing_params: dict[str, Any] | None = None
    config: dict[str, Any] = {}
    trusted_actors: dict[str, Any] | None = None


class IngestWebhook(BaseModel):
    """What the receiver needs to verify a delivery before anything is written."""

    id: str
    endpoint_id: str
    source_type: str
    trust_mode: str
    secret: str | None
    collector_secret: str | None = None  # a generic collector's HMAC secret, opened
    config: dict[str, Any] = {}
    rate_per_second: float | None = None  # the webhook's own pace; None = the operator default
    # A stored secret that did not decrypt: the receiver answers 503 when verification needs it.
    secret_unreadable: bool = False
    collector_secret_unreadable: bool = False


class Todo(BaseModel):
    """A unit of claimable work."""

    id: str
    endpoint_id: str
    queue: str
    source: str
    kind: str | None
    title: str
    payload: Any = None
    event_id: str | None
    idempotency_key: str
    state: str
    owner: str | None
    lease_expires_at: datetime | None
    attempt: int
    max_attempts: int
    result: Any = None
    last_error: str | None = None
    created_at: datetime
    updated_at: datetime
    claimed_at: datetime | None
    completed_at: datetime | None
    next_retry_at: datetime | None
    routing: dict[str, Any] | None = None
    work_order: dict[str, Any] | None = None
    update_event_ids: list[str] = []
    cancel_reason: str | None = None


class TodoPage(BaseModel):
    """One page of todos, newest first, and the cursor of the next when there is one."""

    todos: list[Todo]
    next_cursor: str | None = None
