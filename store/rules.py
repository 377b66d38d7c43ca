"""A webhook's routing configuration: owner-gated reads and a locked read-modify-validate-write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.models import ON_FAULT_VALUES, Grant, OnFault
from routing.rules import (
    Candidate,
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

_LOCK_WEBHOOK = "SELECT id FROM endpoint_webhooks WHERE id = %s AND state = 'live' FOR UPDATE"

_WRITE_RULES = """
UPDATE endpoint_webhooks
SET routing_rules = %(rules)s, routing_default_action = %(default_action)s, routing_params = %(params)s,
    routing_on_fault = %(on_fault)s, updated_at = now()
WHERE id = %(webhook)s
"""


class RuleConfig(BaseModel):
    """A webhook's saved rules, default and params, with the grant they were read (or saved) under."""

    webhook_id: str
    rules: list[dict[str, Any]]
    default_action: dict[str, Any] | None
    params: dict[str, Any] | None
    on_fault: OnFault = "continue"
    grant: Grant


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


async def validated_grant(
    candidate: Candidate, grant: Grant, checker: CompileChecker, known: Compiled | None = None
) -> Grant:
    """The grant with a candidate configuration, validated exactly as a save; a rejection changes nothing."""
    compiled = await compiled_in_sandbox(candidate.rules, checker, known)
    try:
        rules, default_action, params = validate_config(
            candidate.rules, candidate.default_action, candidate.params, grant, compiled=compiled
        )
    except RuleValidationError as exc:
        raise rejection(exc) from exc
    on_fault = validate_on_fault(candidate.on_fault)
    # Unset params stay unset (NULL); they bind as an empty object either way.
    stored_params = params if candidate.params is not None else None
    return grant.model_copy(
        update={"rules": rules, "default_action": default_action, "params": stored_params, "on_fault": on_fault}
    )


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
            grant = await validated_grant(candidate, current.grant, checker, compiled)
            await conn.execute(
                _WRITE_RULES,
                {
                    "rules": Jsonb(grant.rules),
                    "default_action": Jsonb(grant.default_action) if grant.default_action is not None else None,
                    "params": Jsonb(grant.params) if grant.params is not None else None,
                    "on_fault": grant.on_fault,
                    "webhook": webhook_id,
                },
            )
        return _config(grant)

    @translates_errors
    async def webhook_config(self, webhook_id: str) -> dict[str, Any]:
        """The webhook's receiver configuration (collector kind rule, HMAC scheme); call after read()."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT config FROM endpoint_webhooks WHERE id = %s", (webhook_id,))
            row = await cur.fetchone()
        return dict(row["config"] or {}) if row is not None else {}
