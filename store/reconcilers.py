"""Reconcilers as their owners configure them: per-webhook reconciliation against GitHub's delivery log, its
validation, the token sealed at rest, and the view get_webhook_reconciler answers. What a run does with them is
the ledger (store/reconcile_ledger.py); docs/reconcile.md has the whole picture."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from pydantic import BaseModel, Field

from routing.models import Grant
from store.crypto import SecretBox
from store.db import Pool
from store.errors import InvalidArgument, NotFound, translates_errors
from store.models import Caller
from store.rules import UNKNOWN_WEBHOOK
from store.webhooks import WebhookStore
from switchboard.settings import normal_api_url

RECONCILE_SOURCE = "github"
DEFAULT_INTERVAL_SECONDS = 300
INTERVAL_MAX_SECONDS = 86_400
DEFAULT_LOOKBACK_HOURS = 72
LOOKBACK_MAX_HOURS = 72  # GitHub redelivers deliveries of the past three days only
TOKEN_MAX = 1000
DETAIL_MAX = 500

_REPO = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
_ORG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space: it becomes an HTTP header value

ScopeKind = Literal["repo", "org", "app"]
Status = Literal["pending", "ok", "rate_limited", "unauthorized", "forbidden", "not_found", "unavailable", "error"]

_VIEW_COLUMNS = (
    "webhook_id, scope_kind, scope_name, hook_id, api_url, interval_seconds, lookback_hours, temporal_schedule_id,"
    " created_at, updated_at, status, status_detail, status_at, backoff_until, checkpoint_id,"
    " scan_cursor IS NOT NULL AS scanning, last_run_id, last_run_at, last_run, seen_total, missing_total,"
    " requested_total, arrived_total, given_up_total,"
    " (SELECT count(*) FROM webhook_reconcile_deliveries d WHERE d.webhook_id = r.webhook_id"
    "  AND d.state = 'missing')::int AS waiting,"
    " (SELECT count(*) FROM webhook_reconcile_deliveries d WHERE d.webhook_id = r.webhook_id"
    "  AND d.state = 'requested')::int AS requested_open"
)

_UPSERT = """
INSERT INTO webhook_reconcilers (webhook_id, scope_kind, scope_name, hook_id, api_url, token_ciphertext,
    interval_seconds, lookback_hours, temporal_schedule_id, updated_by)
VALUES (%(webhook)s, %(kind)s, %(name)s, %(hook)s, %(api_url)s, %(token)s, %(interval)s, %(lookback)s,
    %(schedule)s, %(by)s)
ON CONFLICT (webhook_id) DO UPDATE SET
    scope_kind = excluded.scope_kind, scope_name = excluded.scope_name, hook_id = excluded.hook_id,
    api_url = excluded.api_url, token_ciphertext = excluded.token_ciphertext,
    interval_seconds = excluded.interval_seconds, lookback_hours = excluded.lookback_hours,
    updated_by = excluded.updated_by, updated_at = now()
"""


def reconcile_schedule_id(webhook_id: str) -> str:
    """The Temporal Schedule that runs a webhook's reconciler."""
    return f"switchboard-reconcile-{webhook_id}"


def token_context(webhook_id: str) -> str:
    """Associated data sealing a reconciler's token: it never opens as another webhook's, or as a signing secret."""
    return f"{webhook_id}:github-reconcile-token"


@dataclass(frozen=True)
class Limits:
    """The operator's bounds on what owners may configure (settings)."""

    api_urls: frozenset[str]
    interval_min_seconds: int


class ReconcilerSetting(BaseModel):
    """set_webhook_reconciler's configuration, before validation (token None: keep the stored one)."""

    scope_kind: ScopeKind
    scope_name: str | None = None
    hook_id: int | None = None
    api_url: str
    token: str | None = Field(default=None, repr=False)
    interval_seconds: int = DEFAULT_INTERVAL_SECONDS
    lookback_hours: int = DEFAULT_LOOKBACK_HOURS


class Totals(BaseModel):
    """Counts over the reconciler's life."""

    seen: int
    missing: int
    requested: int
    arrived: int
    given_up: int


class ReconcilerView(BaseModel):
    """A reconciler as its owner sees it: configuration, checkpoint and state; never the token."""

    webhook_id: str
    scope_kind: ScopeKind
    scope_name: str | None
    hook_id: int | None
    api_url: str
    interval_seconds: int
    lookback_hours: int
    temporal_schedule_id: str
    created_at: datetime
    updated_at: datetime
    status: Status
    status_detail: str | None
    status_at: datetime | None
    backoff_until: datetime | None
    checkpoint_id: int | None
    scanning: bool
    last_run_id: str | None
    last_run_at: datetime | None
    last_run: dict[str, Any] | None
    totals: Totals
    waiting: int
    requested_open: int


def _view(row: dict[str, Any]) -> ReconcilerView:
    totals = Totals(
        seen=row.pop("seen_total"),
        missing=row.pop("missing_total"),
        requested=row.pop("requested_total"),
        arrived=row.pop("arrived_total"),
        given_up=row.pop("given_up_total"),
    )
    return ReconcilerView(totals=totals, **row)


def check_setting(setting: ReconcilerSetting, limits: Limits) -> ReconcilerSetting:
    """The configuration as it will run, or InvalidArgument naming what is wrong (one check for every caller)."""
    kind = setting.scope_kind
    if kind == "repo":
        if setting.scope_name is None or not _REPO.match(setting.scope_name):
            raise InvalidArgument('scope.repo must be "owner/name"')
    elif kind == "org":
        if setting.scope_name is None or not _ORG.match(setting.scope_name):
            raise InvalidArgument("scope.org must be an organization name (letters, digits, '-')")
    elif setting.scope_name is not None:
        raise InvalidArgument("scope.app takes no name")
    if kind == "app":
        if setting.hook_id is not None:
            raise InvalidArgument("hook_id is not given for the app's own hook")
    elif setting.hook_id is None or not 0 < setting.hook_id < 2**63:
        raise InvalidArgument("hook_id must be the GitHub hook's id (a positive integer)")
    try:
        api_url = normal_api_url(setting.api_url)
    except ValueError as exc:
        raise InvalidArgument(f"api_url: {exc}") from None
    if api_url not in limits.api_urls:
        allowed = ", ".join(sorted(limits.api_urls)) or "none"
        raise InvalidArgument(f"api_url {api_url} is not one the operator allows ({allowed})")
    if not limits.interval_min_seconds <= setting.interval_seconds <= INTERVAL_MAX_SECONDS:
        raise InvalidArgument(
            f"interval_seconds must be between {limits.interval_min_seconds} and {INTERVAL_MAX_SECONDS}"
        )
    if not 1 <= setting.lookback_hours <= LOOKBACK_MAX_HOURS:
        raise InvalidArgument(f"lookback_hours must be between 1 and {LOOKBACK_MAX_HOURS} (GitHub's redelivery window)")
    if setting.token is not None and not (0 < len(setting.token) <= TOKEN_MAX and _TOKEN.match(setting.token)):
        raise InvalidArgument(f"token must be 1-{TOKEN_MAX} printable characters without spaces")
    return setting.model_copy(update={"api_url": api_url})


class ReconcilerStore:
    """Reconciler rows as the owner's verbs read and write them."""

    def __init__(self, pool: Pool, box: SecretBox, webhooks: WebhookStore) -> None:
        self.pool = pool
        self.box = box
        self.webhooks = webhooks

    async def _owned_github(self, conn: AsyncConnection[DictRow], caller: Caller, webhook_id: str) -> Grant:
        """A live webhook the caller's human owns; unknown and foreign are the same not_found."""
        grant = await self.webhooks.grant_on(conn, webhook_id)
        if grant is None or grant.human_id != caller.human_id:
            raise NotFound(UNKNOWN_WEBHOOK)
        return grant

    @translates_errors
    async def save(
        self, caller: Caller, webhook_id: str, setting: ReconcilerSetting, limits: Limits
    ) -> tuple[ReconcilerView, bool]:
        """Validate and save a reconciler under the webhook's row lock; whether it is new. A refusal changes nothing.

        A token is required for a new reconciler and whenever api_url changes (a stored token never follows the
        configuration to another host); otherwise an omitted token keeps the stored one. A changed scope, hook or
        api_url starts the scan afresh.
        """
        checked = check_setting(setting, limits)
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT id FROM endpoint_webhooks WHERE id = %s AND state = 'live' FOR UPDATE", (webhook_id,)
            )
            grant = await self._owned_github(conn, caller, webhook_id)
            if grant.source != RECONCILE_SOURCE:
                raise InvalidArgument("reconciliation reads GitHub's delivery log: the webhook must be a github one")
            cur = await conn.execute(
                "SELECT scope_kind, scope_name, hook_id, api_url, token_ciphertext FROM webhook_reconcilers"
                " WHERE webhook_id = %s FOR UPDATE",
                (webhook_id,),
            )
            current = await cur.fetchone()
            if checked.token is not None:
                sealed = self.box.seal(checked.token, token_context(webhook_id))
            elif current is None:
                raise InvalidArgument("token is required for a new reconciler")
            elif current["api_url"] != checked.api_url:
                raise InvalidArgument("token is required again when api_url changes")
            else:
                sealed = bytes(current["token_ciphertext"])
            await conn.execute(
                _UPSERT,
                {
                    "webhook": webhook_id,
                    "kind": checked.scope_kind,
                    "name": checked.scope_name,
                    "hook": checked.hook_id,
                    "api_url": checked.api_url,
                    "token": sealed,
                    "interval": checked.interval_seconds,
                    "lookback": checked.lookback_hours,
                    "schedule": reconcile_schedule_id(webhook_id),
                    "by": caller.endpoint_id,
                },
            )
            moved = current is not None and (
                (current["scope_kind"], current["scope_name"], current["hook_id"], current["api_url"])
                != (checked.scope_kind, checked.scope_name, checked.hook_id, checked.api_url)
            )
            if moved or checked.token is not None:
                # Another hook's log (or a new token): the old checkpoint and any backoff mean nothing for it.
                await conn.execute(
                    "UPDATE webhook_reconcilers SET backoff_until = NULL, status = 'pending', status_detail = NULL"
                    " WHERE webhook_id = %s",
                    (webhook_id,),
                )
            if moved:
                await conn.execute(
                    "UPDATE webhook_reconcilers SET checkpoint_id = NULL, scan_top_id = NULL, scan_cursor = NULL"
                    " WHERE webhook_id = %s",
                    (webhook_id,),
                )
                await conn.execute("DELETE FROM webhook_reconcile_deliveries WHERE webhook_id = %s", (webhook_id,))
            view = await self._view_on(conn, webhook_id)
        assert view is not None
        return view, current is None

    @translates_errors
    async def get(self, caller: Caller, webhook_id: str) -> ReconcilerView | None:
        """The reconciler of a webhook the caller's human owns; None when none is configured."""
        async with self.pool.connection() as conn:
            await self._owned_github(conn, caller, webhook_id)
            return await self._view_on(conn, webhook_id)

    @translates_errors
    async def clear(self, caller: Caller, webhook_id: str) -> bool:
        """Remove the reconciler (and its ledger) of a webhook the caller's human owns; whether there was one."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._owned_github(conn, caller, webhook_id)
            cur = await conn.execute(
                "DELETE FROM webhook_reconcilers WHERE webhook_id = %s RETURNING webhook_id", (webhook_id,)
            )
            return await cur.fetchone() is not None

    @translates_errors
    async def discard(self, webhook_id: str) -> None:
        """Undo the creation of a reconciler whose Temporal Schedule could not be made (nothing has run)."""
        async with self.pool.connection() as conn:
            await conn.execute("DELETE FROM webhook_reconcilers WHERE webhook_id = %s", (webhook_id,))

    async def _view_on(self, conn: AsyncConnection[DictRow], webhook_id: str) -> ReconcilerView | None:
        cur = await conn.execute(
            f"SELECT {_VIEW_COLUMNS} FROM webhook_reconcilers r WHERE webhook_id = %s",  # noqa: S608 - constant
            (webhook_id,),
        )
        row = await cur.fetchone()
        return _view(dict(row)) if row is not None else None


def schedule_summary(row: dict[str, Any]) -> str:
    """The schedule's one line in the Temporal UI: which hook's log it reads."""
    if row["scope_kind"] == "app":
        return f"reconcile {row['webhook_id']} against the GitHub app's hook deliveries"
    return f"reconcile {row['webhook_id']} against GitHub {row['scope_kind']} {row['scope_name']} hook {row['hook_id']}"
