"""A webhook's routing configuration: owner-gated reads and a locked read-modify-validate-write."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.backtest import RecentCheck, RecentFault, recent_faults_message
from routing.models import ON_FAULT_VALUES, Grant, OnFault
from routing.rules import (
    RULE_FAULTS_ON_RECENT_EVENTS,
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
    routing_on_fault = %(on_fault)s, routing_forced = %(forced)s, updated_at = now()
WHERE id = %(webhook)s
"""
_READ_FORCED = "SELECT routing_forced FROM endpoint_webhooks WHERE id = %s"


class RuleConfig(BaseModel):
    """A webhook's saved rules, default and params, with the grant they were read (or saved) under."""

    webhook_id: str
    rules: list[dict[str, Any]]
    default_action: dict[str, Any] | None
    params: dict[str, Any] | None
    on_fault: OnFault = "continue"
    grant: Grant
    # The latest save that went through with force over rules faulting on recent events ({at, by, faults}).
    forced: dict[str, Any] | None = None


Edit = Callable[[RuleConfig], Candidate]
# The save-time replay (routing.backtest.recent_faults, in the rule verbs' sandbox): the rules of a validated
# grant that error or time out on the webhook's latest stored events.
Vet = Callable[[Grant], Awaitable[RecentCheck]]

log = logging.getLogger("switchboard.rules")


def _vetted_by(grant: Grant) -> tuple[Any, ...]:
    """What a save-time replay's verdict depends on: the expressions in order, their params and the gate (which
    shapes .actor). Not ids or names (an id minted on each pass differs) and not actions (never evaluated)."""
    return ([r.get("expr") for r in grant.rules], grant.params, grant.trusted_actors)


def _named(faults: list[RecentFault], grant: Grant) -> list[RecentFault]:
    """The faults with the ids and names of the rules as saved (by index: the expressions are the same)."""
    out: list[RecentFault] = []
    for fault in faults:
        rule = grant.rules[fault.rule_index]
        out.append(fault.model_copy(update={"rule_id": rule.get("id"), "rule_name": rule.get("name")}))
    return out


def faults_rejection(faults: list[RecentFault], replayed: int) -> RuleRejected:
    """The refusal of a save whose rules fault on recent events (422 rule_faults_on_recent_events)."""
    return RuleRejected(recent_faults_message(faults, replayed), code=RULE_FAULTS_ON_RECENT_EVENTS)


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


async def _validated_or_none(
    candidate: Candidate, grant: Grant, checker: CompileChecker, compiled: Compiled
) -> Grant | None:
    """The candidate's grant for the first, unlocked pass; None when it fails validation (the locked pass says why)."""
    try:
        return await validated_grant(candidate, grant, checker, compiled)
    except (StoreUnavailable, StoreRejected, SandboxBusy):
        raise
    except DomainError:
        return None


def _owned(grant: Grant | None, caller: Caller) -> Grant:
    """The grant when the caller's human owns the webhook; unknown and foreign are the same not_found."""
    if grant is None or grant.human_id != caller.human_id:
        raise NotFound(UNKNOWN_WEBHOOK)
    return grant


def _config(grant: Grant, forced: dict[str, Any] | None = None) -> RuleConfig:
    return RuleConfig(
        webhook_id=grant.webhook_id,
        rules=list(grant.rules),
        default_action=grant.default_action,
        params=grant.params,
        on_fault=grant.on_fault,
        grant=grant,
        forced=forced,
    )


async def _forced(conn: AsyncConnection[DictRow], webhook_id: str) -> dict[str, Any] | None:
    cur = await conn.execute(_READ_FORCED, (webhook_id,))
    row = await cur.fetchone()
    return row["routing_forced"] if row is not None else None


class RuleStore:
    """Routing rules stored on endpoint_webhooks, always read and written with the webhook's grant."""

    def __init__(self, pool: Pool, webhooks: WebhookStore) -> None:
        self.pool = pool
        self.webhooks = webhooks

    @translates_errors
    async def read(self, caller: Caller, webhook_id: str) -> RuleConfig:
        """The saved configuration and the current grant of a webhook the caller's human owns."""
        async with self.pool.connection() as conn:
            grant = _owned(await self.webhooks.grant_on(conn, webhook_id), caller)
            forced = await _forced(conn, webhook_id)
        return _config(grant, forced)

    @translates_errors
    async def modify(
        self,
        caller: Caller,
        webhook_id: str,
        edit: Edit,
        checker: CompileChecker,
        *,
        vet: Vet | None = None,
        force: bool = False,
    ) -> RuleConfig:
        """Read-modify-validate-write under the webhook's row lock; a rejected edit changes nothing.

        The candidate's expressions are compile-checked in the sandbox (``checker``) first, outside the lock:
        a check can take up to the sandbox's hard deadline. Errors of that first pass are left to the locked
        pass, which raises them in the usual order; it only compiles what a concurrent save has added since.
        ``vet`` replays the validated rules over the webhook's latest stored events the same way: outside the
        lock, and again under it only when a concurrent save changed what it depends on. A rule that faults
        there refuses the save (rule_faults_on_recent_events) unless ``force``; a forced save is recorded on
        the webhook (routing_forced) and logged at WARNING with the caller.
        """
        compiled: Compiled = {}
        vetted: tuple[tuple[Any, ...], RecentCheck] | None = None
        try:
            current = await self.read(caller, webhook_id)
            first: Candidate | None = edit(current)
        except (StoreUnavailable, StoreRejected):
            raise  # the database's own failure, not a verdict on the edit
        except DomainError:
            first = None  # raised again by the locked pass, after the same checks as ever
        if first is not None:
            compiled = await compiled_in_sandbox(first.rules, checker)
            if vet is not None:
                tried = await _validated_or_none(first, current.grant, checker, compiled)
                if tried is not None:
                    vetted = (_vetted_by(tried), await vet(tried))
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(_LOCK_WEBHOOK, (webhook_id,))
            # The grant is read after the lock, so the list is validated against the state it will run under.
            current = _config(_owned(await self.webhooks.grant_on(conn, webhook_id), caller))
            candidate = edit(current)
            grant = await validated_grant(candidate, current.grant, checker, compiled)
            faults: list[RecentFault] = []
            if vet is not None:
                if vetted is None or vetted[0] != _vetted_by(grant):
                    vetted = (_vetted_by(grant), await vet(grant))
                faults = _named(vetted[1].faults, grant)
            forced: dict[str, Any] | None = None
            if faults:
                assert vetted is not None
                if not force:
                    raise faults_rejection(faults, vetted[1].replayed)
                forced = {
                    "at": datetime.now(UTC).isoformat(),
                    "by": f"endpoint:{caller.endpoint_id}",
                    "faults": [f.model_dump() for f in faults],
                }
            await conn.execute(
                _WRITE_RULES,
                {
                    "rules": Jsonb(grant.rules),
                    "default_action": Jsonb(grant.default_action) if grant.default_action is not None else None,
                    "params": Jsonb(grant.params) if grant.params is not None else None,
                    "on_fault": grant.on_fault,
                    "forced": Jsonb(forced) if forced is not None else None,
                    "webhook": webhook_id,
                },
            )
        if forced is not None:
            log.warning(
                "rules of webhook %s saved with force by endpoint %s (human %s) over faults on recent events: %s",
                webhook_id,
                caller.endpoint_id,
                caller.human_id,
                "; ".join(
                    f"rule {f.rule_index} ({f.rule_id}): {'/'.join(f.causes)} on {', '.join(f.event_ids)}"
                    for f in faults
                ),
            )
        return _config(grant, forced)

    @translates_errors
    async def webhook_config(self, webhook_id: str) -> dict[str, Any]:
        """The webhook's receiver configuration (collector kind rule, HMAC scheme); call after read()."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT config FROM endpoint_webhooks WHERE id = %s", (webhook_id,))
            row = await cur.fetchone()
        return dict(row["config"] or {}) if row is not None else {}
