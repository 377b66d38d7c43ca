"""A webhook's routing configuration: owner-gated reads, locked read-modify-validate-write, replayable events."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.models import ON_FAULT_VALUES, Grant, OnFault
from routing.rules import (
    CompileChecker,
    CompileCheckUnavailable,
    Compiled,
    RuleValidationError,
    compile_verdicts,
    validate_config,
)
from store.db import Pool
from store.errors import (
    DomainError,
    Forbidden,
    InvalidArgument,
    NotFound,
    RuleRejected,
    SandboxBusy,
    StoreRejected,
    StoreUnavailable,
    translates_errors,
)
from store.models import Caller
from store.webhooks import WebhookStore

UNKNOWN_WEBHOOK = "unknown webhook"
UNKNOWN_EVENT = "unknown event"

_LOCK_WEBHOOK = "SELECT id FROM endpoint_webhooks WHERE id = %s AND state = 'live' FOR UPDATE"

_WRITE_RULES = """
UPDATE endpoint_webhooks
SET routing_rules = %(rules)s, routing_default_action = %(default_action)s, routing_params = %(params)s,
    routing_on_fault = %(on_fault)s, updated_at = now()
WHERE id = %(webhook)s
"""

_EVENT_COLUMNS = (
    "id, webhook_id, source, kind, trust_mode, verified, content_type, headers, payload, payload_size,"
    " received_at, routing_trace, disposition, todo_ids"
)

_RECENT_EVENT_IDS = """
SELECT id FROM events WHERE webhook_id = %s ORDER BY received_at DESC, id DESC LIMIT %s
"""


class RuleConfig(BaseModel):
    """A webhook's saved rules, default and params, with the grant they were read (or saved) under."""

    webhook_id: str
    rules: list[dict[str, Any]]
    default_action: dict[str, Any] | None
    params: dict[str, Any] | None
    on_fault: OnFault = "continue"
    grant: Grant


class Candidate(BaseModel):
    """A configuration to validate and save: rules (raw, ids may be missing), default, params and on_fault."""

    rules: list[Any]
    default_action: Any = None
    params: Any = None
    on_fault: Any = "continue"


class StoredEvent(BaseModel):
    """An event as the receiver stored it: enough to rebuild its routing envelope and read its outcome."""

    id: str
    webhook_id: str
    source: str
    kind: str | None
    trust_mode: str
    verified: bool
    content_type: str | None
    headers: dict[str, str]
    payload: bytes
    payload_size: int
    received_at: datetime
    routing_trace: dict[str, Any]
    disposition: str
    todo_ids: list[str]


class StoredTodo(BaseModel):
    """Where a stored delivery landed: one todo's endpoint and queue."""

    id: str
    endpoint_id: str
    queue: str


Edit = Callable[[RuleConfig], Candidate]


def rejection(exc: RuleValidationError) -> DomainError:
    """Routing's validation code verbatim (422), except not_granted, which surfaces as forbidden."""
    if exc.code == "not_granted":
        return Forbidden(exc.message)
    return RuleRejected(exc.message, code=exc.code)


async def compiled_in_sandbox(rules: Any, checker: CompileChecker, known: Compiled | None = None) -> Compiled:
    """The sandbox's compile verdicts for a candidate's rules; a sandbox that cannot check answers sandbox_busy."""
    try:
        return await compile_verdicts(rules, checker, known)
    except CompileCheckUnavailable as exc:
        raise SandboxBusy(f"the rules could not be compile-checked: {exc}; nothing was saved") from exc


def validate_on_fault(value: Any) -> OnFault:
    """The saved on_fault: exactly "continue" or "hold"; anything else changes nothing (invalid_argument)."""
    if value == "continue":
        return "continue"
    if value == "hold":
        return "hold"
    raise InvalidArgument(f"on_fault must be one of {', '.join(ON_FAULT_VALUES)}")


def _owned(grant: Grant | None, caller: Caller) -> Grant:
    """The grant when the caller's human owns the webhook; unknown and foreign are the same not_found."""
    if grant is None or grant.human_id != caller.human_id:
        raise NotFound(UNKNOWN_WEBHOOK)
    return grant


def _config(grant: Grant) -> RuleConfig:
    return RuleConfig(
        webhook_id=grant.webhook_id,
        rules=list(grant.rules),
        default_action=grant.default_action,
        params=grant.params,
        on_fault=grant.on_fault,
        grant=grant,
    )


class RuleStore:
    """Routing rules stored on endpoint_webhooks, always read and written with the webhook's grant."""

    def __init__(self, pool: Pool, webhooks: WebhookStore) -> None:
        self.pool = pool
        self.webhooks = webhooks

    @translates_errors
    async def read(self, caller: Caller, webhook_id: str) -> RuleConfig:
        """The saved configuration and the current grant of a webhook the caller's human owns."""
        async with self.pool.connection() as conn:
            grant = await self.webhooks.grant_on(conn, webhook_id)
        return _config(_owned(grant, caller))

    @translates_errors
    async def modify(self, caller: Caller, webhook_id: str, edit: Edit, checker: CompileChecker) -> RuleConfig:
        """Read-modify-validate-write under the webhook's row lock; a rejected edit changes nothing.

        The candidate's expressions are compile-checked in the sandbox (``checker``) first, outside the lock:
        a check can take up to the sandbox's hard deadline. Errors of that first pass are left to the locked
        pass, which raises them in the usual order; it only compiles what a concurrent save has added since.
        """
        compiled: Compiled = {}
        try:
            first: Candidate | None = edit(await self.read(caller, webhook_id))
        except (StoreUnavailable, StoreRejected):
            raise  # the database's own failure, not a verdict on the edit
        except DomainError:
            first = None  # raised again by the locked pass, after the same checks as ever
        if first is not None:
            compiled = await compiled_in_sandbox(first.rules, checker)
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(_LOCK_WEBHOOK, (webhook_id,))
            # The grant is read after the lock, so the list is validated against the state it will run under.
            current = _config(_owned(await self.webhooks.grant_on(conn, webhook_id), caller))
            candidate = edit(current)
            compiled = await compiled_in_sandbox(candidate.rules, checker, compiled)
            try:
                rules, default_action, params = validate_config(
                    candidate.rules, candidate.default_action, candidate.params, current.grant, compiled=compiled
                )
            except RuleValidationError as exc:
                raise rejection(exc) from exc
            on_fault = validate_on_fault(candidate.on_fault)
            # Unset params stay unset (NULL); they bind as an empty object either way.
            stored_params = params if candidate.params is not None else None
            await conn.execute(
                _WRITE_RULES,
                {
                    "rules": Jsonb(rules),
                    "default_action": Jsonb(default_action) if default_action is not None else None,
                    "params": Jsonb(stored_params) if stored_params is not None else None,
                    "on_fault": on_fault,
                    "webhook": webhook_id,
                },
            )
        grant = current.grant.model_copy(
            update={"rules": rules, "default_action": default_action, "params": stored_params, "on_fault": on_fault}
        )
        return _config(grant)

    @translates_errors
    async def webhook_config(self, webhook_id: str) -> dict[str, Any]:
        """The webhook's receiver configuration (collector kind rule, HMAC scheme); call after read()."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT config FROM endpoint_webhooks WHERE id = %s", (webhook_id,))
            row = await cur.fetchone()
        return dict(row["config"] or {}) if row is not None else {}

    @translates_errors
    async def event(self, webhook_id: str, event_id: str) -> StoredEvent:
        """One event recorded on this webhook; an event of any other webhook is not_found."""
        found = await self.events(webhook_id, [event_id])
        if not found:
            raise NotFound(UNKNOWN_EVENT)
        return found[0]

    @translates_errors
    async def recent_event_ids(self, webhook_id: str, limit: int) -> list[str]:
        """Ids of the webhook's most recent events, newest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_RECENT_EVENT_IDS, (webhook_id, limit))
            rows = await cur.fetchall()
        return [str(r["id"]) for r in rows]

    @translates_errors
    async def events(self, webhook_id: str, event_ids: Sequence[str]) -> list[StoredEvent]:
        """The named events of this webhook (payloads included), in the order asked; others are skipped."""
        if not event_ids:
            return []
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events"  # noqa: S608 - constant column list
                " WHERE webhook_id = %s AND id = ANY(%s)",
                (webhook_id, list(event_ids)),
            )
            rows = await cur.fetchall()
        by_id = {r["id"]: StoredEvent.model_validate({**r, "payload": bytes(r["payload"])}) for r in rows}
        return [by_id[i] for i in event_ids if i in by_id]

    @translates_errors
    async def todos(self, todo_ids: Sequence[str]) -> dict[str, StoredTodo]:
        """Endpoint and queue of the named todos that still exist (retention may have pruned some)."""
        if not todo_ids:
            return {}
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT id, endpoint_id, queue FROM todos WHERE id = ANY(%s)", (list(todo_ids),))
            rows = await cur.fetchall()
        return {r["id"]: StoredTodo.model_validate(r) for r in rows}

    @translates_errors
    async def once_claims(self, webhook_id: str, keys: Sequence[str]) -> dict[str, str]:
        """once_key → claiming event id, for the keys of this webhook already claimed."""
        if not keys:
            return {}
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT once_key, event_id FROM routing_once WHERE webhook_id = %s AND once_key = ANY(%s)",
                (webhook_id, list(keys)),
            )
            rows = await cur.fetchall()
        return {r["once_key"]: r["event_id"] for r in rows}
