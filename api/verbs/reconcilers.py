"""Reconciler verbs of the webhooks family: read GitHub's own delivery log and have GitHub redeliver what never
arrived (a delivery refused while no API process listened is otherwise lost: GitHub never retries).

Owner-gated like the rule verbs: the caller's human owns the webhook; another tenant's webhook is the same
not_found as an unknown one. Each reconciler is a Temporal Schedule (`switchboard-reconcile-<webhook id>`) whose
runs are `ReconcileWebhook` workflows; the token is sealed at rest and never returned.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, model_validator
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from api.verbs.registry import READ, CliArg, CliCommand, Context, Hints, VerbInput, verb
from api.verbs.rules import FAMILY, WebhookInput
from api.verbs.schedules import Unavailable
from runtime.reconcilers import put_schedule, remove_schedule
from runtime.root import reconcile_limits
from store.errors import InvalidArgument
from store.reconcile_ledger import ScheduleEntry
from store.reconcilers import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_LOOKBACK_HOURS,
    LOOKBACK_MAX_HOURS,
    ReconcilerSetting,
    ReconcilerView,
    ScopeKind,
    Totals,
    schedule_summary,
)
from switchboard.github import API_URL

log = logging.getLogger("switchboard.reconcile")

RECONCILER_HELP = "GitHub delivery-log reconcilers of your github webhooks"


class ScopeIn(VerbInput):
    """Exactly one of repo, org or app: whose hook GitHub keeps the delivery log of."""

    repo: str | None = Field(default=None, max_length=201, description='a repository hook: "owner/name"')
    org: str | None = Field(default=None, max_length=39, description="an organization hook: the organization")
    app: bool | None = Field(
        default=None, description="true: the GitHub App's own hook (the token is then the app's bearer credential)"
    )

    @model_validator(mode="after")
    def _one(self) -> ScopeIn:
        given = [k for k in ("repo", "org") if getattr(self, k) is not None] + (["app"] if self.app else [])
        if len(given) != 1 or self.app is False:
            raise ValueError('give exactly one of {"repo": "owner/name"}, {"org": "name"} or {"app": true}')
        return self


class SetReconcilerInput(WebhookInput):
    scope: ScopeIn = Field(
        description='whose hook GitHub keeps the log of: {"repo": "owner/name"}, {"org": "name"} or {"app": true}'
    )
    hook_id: int | None = Field(
        default=None, gt=0, description="the hook's id on GitHub (repo and org scopes; none for app)"
    )
    token: str | None = Field(
        default=None,
        repr=False,
        min_length=1,
        max_length=1000,
        description="a token that may read and redeliver the hook's deliveries (fine-grained: Webhooks read and"
        " write; classic: admin:repo_hook or admin:org_hook); for app, a ready app bearer credential. Sealed at"
        " rest, never returned. Omitted: the stored one stays (required for a new reconciler and a new api_url)",
    )
    api_url: str | None = Field(
        default=None,
        max_length=500,
        description=f"the GitHub API base URL (default {API_URL}; GitHub Enterprise: https://ghe.example/api/v3),"
        " one the operator allows",
    )
    interval_seconds: int | None = Field(
        default=None, gt=0, le=86_400, description=f"seconds between runs (default {DEFAULT_INTERVAL_SECONDS})"
    )
    lookback_hours: int | None = Field(
        default=None,
        ge=1,
        le=LOOKBACK_MAX_HOURS,
        description=f"how far back to look, at most {LOOKBACK_MAX_HOURS} (GitHub's redelivery window; default"
        f" {DEFAULT_LOOKBACK_HOURS})",
    )


class LastRunOut(BaseModel):
    run_id: str = Field(description="the ReconcileWebhook run in Temporal")
    at: datetime
    counts: dict[str, Any] = Field(description="pages, seen, missing, requested, arrived, given_up, present, …")


class ReconcilerOut(BaseModel):
    scope: dict[str, str | bool]
    hook_id: int | None
    api_url: str
    interval_seconds: int
    lookback_hours: int
    has_token: bool = Field(default=True, description="a token is stored (it is never shown)")
    temporal_schedule_id: str = Field(description="open it in the Temporal UI: one run per interval")
    status: str = Field(
        description="pending (no run yet), ok, rate_limited, unauthorized, forbidden, not_found, unavailable, error"
    )
    status_detail: str | None
    status_at: datetime | None
    backoff_until: datetime | None = Field(description="no call to GitHub before this (its rate limit)")
    checkpoint_id: int | None = Field(description="every GitHub delivery attempt up to this id has been examined")
    scanning: bool = Field(description="a scan stopped at a run's page limit; the next run continues it")
    last_run: LastRunOut | None
    totals: Totals
    waiting: int = Field(description="missing deliveries not asked for yet (due later, or past this run's limit)")
    requested_open: int = Field(description="redeliveries asked for that have not arrived yet")
    created_at: datetime
    updated_at: datetime


class ReconcilerOutput(BaseModel):
    webhook_id: str
    reconciler: ReconcilerOut | None = Field(description="null: none configured")
    enabled: bool = Field(description="the operator's switch: false pauses every reconciler")


class ClearReconcilerOutput(BaseModel):
    webhook_id: str
    cleared: bool = Field(description="false when none was configured (still a success)")


def _out(view: ReconcilerView) -> ReconcilerOut:
    scope: dict[str, str | bool] = (
        {"app": True} if view.scope_kind == "app" else {view.scope_kind: view.scope_name or ""}
    )
    last = (
        LastRunOut(run_id=view.last_run_id, at=view.last_run_at, counts=view.last_run or {})
        if view.last_run_id is not None and view.last_run_at is not None
        else None
    )
    return ReconcilerOut(
        scope=scope,
        hook_id=view.hook_id,
        api_url=view.api_url,
        interval_seconds=view.interval_seconds,
        lookback_hours=view.lookback_hours,
        temporal_schedule_id=view.temporal_schedule_id,
        status=view.status,
        status_detail=view.status_detail,
        status_at=view.status_at,
        backoff_until=view.backoff_until,
        checkpoint_id=view.checkpoint_id,
        scanning=view.scanning,
        last_run=last,
        totals=view.totals,
        waiting=view.waiting,
        requested_open=view.requested_open,
        created_at=view.created_at,
        updated_at=view.updated_at,
    )


def _client(ctx: Context) -> Client:
    client = ctx.services.temporal
    if client is None:
        raise Unavailable("scheduling is unavailable, retry later")
    return client


def _entry(view: ReconcilerView) -> ScheduleEntry:
    row = {"webhook_id": view.webhook_id, "scope_kind": view.scope_kind, "scope_name": view.scope_name}
    return ScheduleEntry(
        view.webhook_id,
        view.temporal_schedule_id,
        view.interval_seconds,
        schedule_summary({**row, "hook_id": view.hook_id}),
    )


@verb(
    "set_webhook_reconciler",
    input=SetReconcilerInput,
    output=ReconcilerOutput,
    family=FAMILY,
    summary="Reconcile a github webhook against GitHub's own delivery log: every interval, deliveries GitHub"
    " sent that Switchboard never got are redelivered by GitHub (signed, through the normal ingest path).",
    rate_class="webhook_admin",
    hints=Hints(destructive=True, idempotent=True),
    cli=CliCommand(
        "reconciler",
        RECONCILER_HELP,
        "set",
        "set_webhook_reconciler: read a GitHub hook's delivery log and have GitHub redeliver what never arrived",
        (
            CliArg("webhook_id", help="the github webhook (wh_…)"),
            CliArg("repo", "--repo", metavar="OWNER/NAME", help="a repository hook"),
            CliArg("org", "--org", metavar="ORG", help="an organization hook"),
            CliArg("app", "--app", switch=True, help="the GitHub App's own hook"),
            CliArg("hook_id", "--hook-id", type="int", help="the hook's id on GitHub (repo and org)"),
            CliArg(
                # Not "token": the command line's own --token is the owner's credential.
                "github_token",
                "--token-file",
                type="secret_file",
                metavar="FILE",
                help="a file holding the GitHub token (- for stdin); omitted keeps the stored one",
            ),
            CliArg("api_url", "--api-url", help=f"GitHub Enterprise API base URL (default {API_URL})"),
            CliArg("interval_seconds", "--interval", type="int", metavar="SECONDS", help="seconds between runs"),
            CliArg("lookback_hours", "--lookback", type="int", metavar="HOURS", help="hours to look back (≤ 72)"),
        ),
        complete="reconciler_scope",
    ),
)
async def set_webhook_reconciler(ctx: Context, data: SetReconcilerInput) -> ReconcilerOutput:
    client = _client(ctx)
    settings = ctx.services.settings
    scope = data.scope
    kind: ScopeKind = "repo" if scope.repo is not None else "org" if scope.org is not None else "app"
    setting = ReconcilerSetting(
        scope_kind=kind,
        scope_name=scope.repo if kind == "repo" else scope.org,
        hook_id=data.hook_id,
        api_url=data.api_url or API_URL,
        token=data.token,
        interval_seconds=data.interval_seconds or DEFAULT_INTERVAL_SECONDS,
        lookback_hours=data.lookback_hours or DEFAULT_LOOKBACK_HOURS,
    )
    store = ctx.services.reconcilers
    view, created = await store.save(ctx.caller, data.webhook_id, setting, reconcile_limits(settings))
    try:
        await put_schedule(client, _entry(view), settings)
    except RPCError as exc:
        if created:
            await store.discard(data.webhook_id)
        if exc.status == RPCStatusCode.INVALID_ARGUMENT:
            raise InvalidArgument(f"Temporal refused the schedule: {exc.message}") from exc
        log.exception("could not put reconcile schedule %s", view.temporal_schedule_id)
        raise Unavailable("scheduling is unavailable, retry later (the same call finishes the job)") from exc
    except BaseException:
        if created:
            await store.discard(data.webhook_id)
        raise
    return ReconcilerOutput(webhook_id=data.webhook_id, reconciler=_out(view), enabled=settings.reconcile)


@verb(
    "get_webhook_reconciler",
    input=WebhookInput,
    output=ReconcilerOutput,
    family=FAMILY,
    summary="A github webhook's reconciler: its configuration (never the token), checkpoint, state and the last"
    " run's counts; null when none.",
    hints=READ,
    cli=CliCommand(
        "reconciler",
        RECONCILER_HELP,
        "get",
        "get_webhook_reconciler: a webhook's reconciler, its state and the last run's counts",
        (CliArg("webhook_id", help="the github webhook (wh_…)"),),
    ),
)
async def get_webhook_reconciler(ctx: Context, data: WebhookInput) -> ReconcilerOutput:
    view = await ctx.services.reconcilers.get(ctx.caller, data.webhook_id)
    return ReconcilerOutput(
        webhook_id=data.webhook_id,
        reconciler=_out(view) if view is not None else None,
        enabled=ctx.services.settings.reconcile,
    )


@verb(
    "clear_webhook_reconciler",
    input=WebhookInput,
    output=ClearReconcilerOutput,
    family=FAMILY,
    summary="Stop reconciling a github webhook: its schedule, its token and its ledger are removed.",
    rate_class="webhook_admin",
    hints=Hints(destructive=True, idempotent=True),
    cli=CliCommand(
        "reconciler",
        RECONCILER_HELP,
        "clear",
        "clear_webhook_reconciler: stop reconciling a webhook (schedule and token removed)",
        (CliArg("webhook_id", help="the github webhook (wh_…)"),),
    ),
)
async def clear_webhook_reconciler(ctx: Context, data: WebhookInput) -> ClearReconcilerOutput:
    store = ctx.services.reconcilers
    view = await store.get(ctx.caller, data.webhook_id)
    if view is None:
        return ClearReconcilerOutput(webhook_id=data.webhook_id, cleared=False)
    # Temporal first: if it is unreachable the reconciler stays whole and a retry finishes the job.
    try:
        await remove_schedule(_client(ctx), view.temporal_schedule_id)
    except RPCError as exc:
        log.exception("could not delete reconcile schedule %s", view.temporal_schedule_id)
        raise Unavailable("scheduling is unavailable, retry later") from exc
    cleared = await store.clear(ctx.caller, data.webhook_id)
    return ClearReconcilerOutput(webhook_id=data.webhook_id, cleared=cleared)
