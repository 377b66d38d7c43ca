"""Rule verbs of the webhooks family: manage a webhook's rules, dry-run them, backtest them over history.

Shapes and handlers only. Mutations compile their rules in the rule sandbox, then read-modify-validate-write
under the webhook's row lock (store.rules); the dry-run and the backtest route through the receiver's own
router (routing.router) with this process's rule sandbox, replay stored events (routing.backtest over
store.events) and persist nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field, StrictBool

from api.verbs.registry import READ, AnyJson, CliArg, CliCommand, Context, Hints, VerbInput, verb
from api.verbs.rule_schema import ActionJSON, RuleJSON, RulePatchJSON, RulesJSON
from routing import backtest
from routing.backtest import BacktestSummary, DecisionSummary, RecentCheck, ReplayedEvent
from routing.models import Grant, OnFault
from routing.router import evaluator, route
from routing.rules import Candidate
from routing.sandbox import SandboxPool
from routing.trust import Release
from store.errors import InvalidArgument, RuleNotFound, SandboxBusy
from store.events import EventStore
from store.rules import Edit, RuleConfig, Vet, validated_grant

FAMILY = "webhooks"
BACKTEST_MAX = 200
BACKTEST_DEFAULT = 50


_RULES_DOC = "ordered rules {id?, name?, expr, action}; ids are minted when omitted"
_DEFAULT_DOC = 'the action when no rule matches; null means {"queue": <target queue>} on every target'
_PARAMS_DOC = "JSON object bound as $params in every expression (≤ 16 KiB encoded)"
_FORCE_DOC = (
    "save even when a rule errors or times out on some of the webhook's latest 50 stored events (otherwise"
    " refused with rule_faults_on_recent_events); the override is recorded as `forced`"
)
_ON_FAULT_DOC = (
    '"continue" (a faulted rule is a no-match) or "hold" (any fault stops evaluation; the event is stored as'
    " faulted and nothing is minted)"
)


# ---------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------


class WebhookInput(VerbInput):
    webhook_id: str = Field(min_length=1, max_length=128, description="one of your webhooks (list_webhooks)")


class SaveInput(WebhookInput):
    """A rule verb that saves: the rules are replayed over the webhook's latest stored events first."""

    force: StrictBool = Field(default=False, description=_FORCE_DOC)


class GrantTargetOut(BaseModel):
    """One live delivery target, in target order, with the scope queues exclusive delivery reads."""

    endpoint_id: str
    scope_queues: list[str]
    owner: bool = Field(description="the webhook's owning endpoint (always first when live)")


class GrantOut(BaseModel):
    """What a rule may reach right now, computed from switchboard state."""

    queues: list[str]
    endpoints: list[GrantTargetOut]


class RulesOutput(BaseModel):
    """A webhook's full routing configuration and the grant it is checked against."""

    webhook_id: str
    rules: RulesJSON
    default_action: ActionJSON | None = Field(description=_DEFAULT_DOC)
    effective_default_action: ActionJSON = Field(description="the default that applies today")
    params: dict[str, Any] | None
    on_fault: OnFault = Field(description=_ON_FAULT_DOC)
    grant: GrantOut
    forced: dict[str, Any] | None = Field(
        default=None,
        description=(
            "the latest save that went through with force over rules faulting on recent events: {at, by, faults}"
            " (null once a save found none)"
        ),
    )


class SetRulesInput(SaveInput):
    rules: RulesJSON = Field(description=_RULES_DOC)
    default_action: ActionJSON | None = Field(default=None, description=_DEFAULT_DOC)
    params: dict[str, Any] | None = Field(default=None, description=_PARAMS_DOC + "; omitting it clears them")
    on_fault: OnFault | None = Field(
        default=None, description=_ON_FAULT_DOC + "; omitted: the saved value stays (a careless save never loosens it)"
    )


class AddRuleInput(SaveInput):
    rule: RuleJSON = Field(description="the rule to insert: {id?, name?, expr, action}")
    position: int | None = Field(default=None, ge=0, description="index to insert at; default: the end")


class AddRuleOutput(RulesOutput):
    rule_id: str = Field(description="the added rule's id (minted when omitted)")


class UpdateRuleInput(SaveInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to change")
    rule: RulePatchJSON = Field(
        description="fields to replace (id, name, expr, action); a null name removes it; a new id renames"
    )


class MoveRuleInput(SaveInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to move")
    position: int = Field(ge=0, description="the rule's index after the move")


class RemoveRuleInput(SaveInput):
    rule_id: str = Field(min_length=1, max_length=256, description="the id of the rule to remove")


class RemoveRuleOutput(RulesOutput):
    removed: bool = Field(description="false when no rule had that id (still a success)")


class CandidateInput(WebhookInput):
    """Candidate configuration; each omitted field falls back to the saved one. Never saved."""

    rules: RulesJSON | None = Field(default=None, description=_RULES_DOC + "; omitted: the saved rules")
    default_action: ActionJSON | None = Field(default=None, description=_DEFAULT_DOC + "; omitted: the saved default")
    params: dict[str, Any] | None = Field(default=None, description=_PARAMS_DOC + "; omitted: the saved params")
    on_fault: OnFault | None = Field(default=None, description=_ON_FAULT_DOC + "; omitted: the saved value")


class DryRunInput(CandidateInput):
    payload: AnyJson = Field(default=None, description="a sample body (any JSON value), treated as verified")
    headers: dict[str, str] | None = Field(default=None, description="the sample's request headers")
    event_id: str | None = Field(default=None, min_length=1, max_length=128, description="an event of this webhook")
    omit_envelope: StrictBool = Field(default=False, description="leave the evaluated envelope out of the answer")
    released: StrictBool = Field(
        default=False,
        description="try it as a release by you now (.release set): past the trust gate, as release_webhook_event routes",
    )


class DryRunOutput(BaseModel):
    webhook_id: str
    event_id: str | None
    candidate: bool = Field(description="true when candidate rules, default or params were tried")
    decision: DecisionSummary
    trace: dict[str, Any]
    envelope: dict[str, Any] | None


class BacktestInput(CandidateInput):
    limit: int = Field(default=BACKTEST_DEFAULT, ge=1, le=BACKTEST_MAX, description="most recent events to replay")


class BacktestOutput(BaseModel):
    webhook_id: str
    candidate: bool
    events: list[ReplayedEvent] = Field(description="newest first")
    summary: BacktestSummary


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def _out(config: RuleConfig) -> dict[str, Any]:
    grant = config.grant
    return {
        "webhook_id": config.webhook_id,
        "rules": config.rules,
        "default_action": config.default_action,
        "effective_default_action": config.default_action or {"queue": grant.target_queue},
        "params": config.params,
        "on_fault": config.on_fault,
        "forced": config.forced,
        "grant": GrantOut(
            queues=grant.queues(),
            endpoints=[
                GrantTargetOut(
                    endpoint_id=t.endpoint_id,
                    scope_queues=t.scope_queues,
                    owner=t.endpoint_id == grant.owner_endpoint_id,
                )
                for t in grant.targets
            ],
        ),
    }


def _index_of(rules: RulesJSON, rule_id: str) -> int | None:
    return next((i for i, r in enumerate(rules) if r.get("id") == rule_id), None)


def sandbox_of(ctx: Context) -> SandboxPool:
    """The rule verbs' own sandbox pool (built by the app lifespan): dry-runs, backtests and save-time compiles."""
    pool = ctx.services.rule_sandbox
    if pool is None:
        raise RuntimeError("the rule verbs' sandbox is not running (app lifespan not entered)")
    return pool


def history_of(ctx: Context) -> EventStore:
    """The event history the dry-run and the backtest replay."""
    return EventStore(ctx.services.pool)


def vet_of(ctx: Context) -> Vet:
    """A save's replay of its rules over the webhook's latest stored events, in the rule verbs' sandbox."""
    history, evaluate = history_of(ctx), evaluator(sandbox_of(ctx))

    async def vet(grant: Grant) -> RecentCheck:
        # Queued behind the caller's own backtests, like them: up to 50 evaluations.
        async with ctx.services.backtests.hold(ctx.caller.endpoint_id):
            check = await backtest.recent_faults(history, grant, evaluate)
        if check.unchecked:
            raise SandboxBusy(
                f"{check.unchecked} of the latest stored events could not be evaluated in time; nothing was saved"
            )
        return check

    return vet


async def saved(ctx: Context, data: SaveInput, edit: Edit) -> RuleConfig:
    """A rule verb's save: validated, compiled and replayed over recent events, under the webhook's lock."""
    return await ctx.services.rules.modify(
        ctx.caller, data.webhook_id, edit, sandbox_of(ctx), vet=vet_of(ctx), force=data.force
    )


async def tried_grant(ctx: Context, saved: RuleConfig, data: CandidateInput) -> tuple[Grant, bool]:
    """The grant to replay: the saved one, or with the candidate's fields validated exactly as a save."""
    candidate = backtest.candidate_of(saved.grant, {k: getattr(data, k) for k in data.model_fields_set})
    if candidate is None:
        return saved.grant, False
    return await validated_grant(candidate, saved.grant, sandbox_of(ctx)), True


# ---------------------------------------------------------------------------------------------------
# Verbs
# ---------------------------------------------------------------------------------------------------

RULES_HELP = "routing rules (as the webhook's owner)"
CONFIG_HELP = "JSON file (- for stdin): {rules, default_action, params, on_fault}, or a rules array"


@verb(
    "list_webhook_rules",
    input=WebhookInput,
    output=RulesOutput,
    family=FAMILY,
    summary="A webhook's rules, default action, params and current grant.",
    hints=READ,
    cli=CliCommand(
        "rules",
        RULES_HELP,
        "list",
        "list_webhook_rules: a webhook's rules, default action, params and grant",
        (CliArg("webhook_id", help="the webhook (wh_…)"),),
        columns=("id", "name", "expr", "action"),
    ),
)
async def list_webhook_rules(ctx: Context, data: WebhookInput) -> RulesOutput:
    return RulesOutput(**_out(await ctx.services.rules.read(ctx.caller, data.webhook_id)))


@verb(
    "set_webhook_rules",
    input=SetRulesInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Replace a webhook's rules, default action and params together (omitted params are cleared).",
    rate_class="authoring",
    hints=Hints(destructive=True),
    cli=CliCommand(
        "rules",
        RULES_HELP,
        "set",
        "set_webhook_rules: replace a webhook's rules from a JSON file (params left out are cleared)",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg("config", "--file", required=True, type="json_file", metavar="FILE", help=CONFIG_HELP),
            CliArg("force", "--force", switch=True, help="save even if a rule faults on recent events (recorded)"),
        ),
        complete="spread_config",
        columns=("id", "name", "expr", "action"),
    ),
)
async def set_webhook_rules(ctx: Context, data: SetRulesInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        on_fault = data.on_fault if data.on_fault is not None else current.on_fault
        return Candidate(rules=data.rules, default_action=data.default_action, params=data.params, on_fault=on_fault)

    return RulesOutput(**_out(await saved(ctx, data, edit)))


@verb(
    "add_webhook_rule",
    input=AddRuleInput,
    output=AddRuleOutput,
    family=FAMILY,
    summary="Insert one rule (at position, default the end); the id is minted when omitted.",
    rate_class="authoring",
)
async def add_webhook_rule(ctx: Context, data: AddRuleInput) -> AddRuleOutput:
    placed: list[int] = []

    def edit(current: RuleConfig) -> Candidate:
        rules: list[Any] = list(current.rules)
        position = len(rules) if data.position is None else data.position
        if position > len(rules):
            raise InvalidArgument(f"position {position} is past the end of the list ({len(rules)} rules)")
        rules.insert(position, data.rule)
        placed.append(position)
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    config = await saved(ctx, data, edit)
    return AddRuleOutput(**_out(config), rule_id=config.rules[placed[-1]]["id"])


@verb(
    "update_webhook_rule",
    input=UpdateRuleInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Change fields of one rule by id; the list is re-validated in full.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def update_webhook_rule(ctx: Context, data: UpdateRuleInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        index = _index_of(current.rules, data.rule_id)
        if index is None:
            raise RuleNotFound(f"no rule with id {json.dumps(data.rule_id)}")
        merged: dict[str, Any] = {**current.rules[index], **data.rule}
        if merged.get("id") is None:
            merged["id"] = data.rule_id
        if merged.get("name", ...) is None:
            del merged["name"]
        rules: list[Any] = list(current.rules)
        rules[index] = merged
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    return RulesOutput(**_out(await saved(ctx, data, edit)))


@verb(
    "move_webhook_rule",
    input=MoveRuleInput,
    output=RulesOutput,
    family=FAMILY,
    summary="Move one rule to a new index (first match wins, so order is meaning).",
    rate_class="authoring",
    hints=Hints(idempotent=True),
)
async def move_webhook_rule(ctx: Context, data: MoveRuleInput) -> RulesOutput:
    def edit(current: RuleConfig) -> Candidate:
        index = _index_of(current.rules, data.rule_id)
        if index is None:
            raise RuleNotFound(f"no rule with id {json.dumps(data.rule_id)}")
        if data.position >= len(current.rules):
            raise InvalidArgument(f"position {data.position} is out of range ({len(current.rules)} rules)")
        rules: list[Any] = list(current.rules)
        rules.insert(data.position, rules.pop(index))
        return Candidate(
            rules=rules, default_action=current.default_action, params=current.params, on_fault=current.on_fault
        )

    return RulesOutput(**_out(await saved(ctx, data, edit)))


@verb(
    "remove_webhook_rule",
    input=RemoveRuleInput,
    output=RemoveRuleOutput,
    family=FAMILY,
    summary="Remove one rule by id; removing an absent rule succeeds.",
    rate_class="authoring",
    hints=Hints(destructive=True, idempotent=True),
)
async def remove_webhook_rule(ctx: Context, data: RemoveRuleInput) -> RemoveRuleOutput:
    store = ctx.services.rules
    current = await store.read(ctx.caller, data.webhook_id)
    if _index_of(current.rules, data.rule_id) is None:
        return RemoveRuleOutput(**_out(current), removed=False)
    removed: list[bool] = []

    def edit(locked: RuleConfig) -> Candidate:
        # Re-checked under the lock: a concurrent remove may have won.
        rules = [r for r in locked.rules if r.get("id") != data.rule_id]
        removed.append(len(rules) != len(locked.rules))
        return Candidate(
            rules=rules, default_action=locked.default_action, params=locked.params, on_fault=locked.on_fault
        )

    config = await saved(ctx, data, edit)
    return RemoveRuleOutput(**_out(config), removed=removed[-1])


@verb(
    "test_webhook_rules",
    input=DryRunInput,
    output=DryRunOutput,
    family=FAMILY,
    summary="Dry-run saved or candidate rules on a sample payload or a stored event; nothing is saved.",
    rate_class="authoring",
    hints=READ,
    cli=CliCommand(
        "rules",
        RULES_HELP,
        "test",
        "test_webhook_rules: dry-run the saved (or --rules candidate) rules on a sample or a stored event",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg(
                "payload", "--payload", type="json_file", metavar="FILE", help="a sample body (JSON file, - for stdin)"
            ),
            CliArg(
                "headers", "--headers", type="json_file", metavar="FILE", help="the sample's headers (JSON object file)"
            ),
            CliArg("event_id", "--event", help="a stored event of this webhook (ev_…) instead of a sample"),
            CliArg("config", "--rules", type="json_file", metavar="FILE", help="candidate: " + CONFIG_HELP),
            CliArg("omit_envelope", "--omit-envelope", switch=True, help="leave the evaluated envelope out"),
            CliArg("released", "--released", switch=True, help="try it as released by you (past the trust gate)"),
        ),
        complete="spread_config",
    ),
)
async def test_webhook_rules(ctx: Context, data: DryRunInput) -> DryRunOutput:
    has_payload = "payload" in data.model_fields_set
    has_event = data.event_id is not None
    if has_payload == has_event:
        raise InvalidArgument("give exactly one of payload (with optional headers) or event_id")
    if data.headers is not None and not has_payload:
        raise InvalidArgument("headers go with a sample payload; a stored event has its own")
    saved = await ctx.services.rules.read(ctx.caller, data.webhook_id)
    grant, is_candidate = await tried_grant(ctx, saved, data)
    release = Release(by=f"endpoint:{ctx.caller.endpoint_id}", at=datetime.now(UTC).isoformat())
    if data.event_id is not None:
        stored = await history_of(ctx).stored_event(data.webhook_id, data.event_id)
        if data.released:
            stored = stored.model_copy(update={"release": release})
        envelope = stored.envelope(grant.trusted_actors)
    else:
        config = await ctx.services.rules.webhook_config(data.webhook_id)
        shown = release if data.released else None
        envelope = backtest.sample_envelope(grant, config, data.payload, data.headers, release=shown)
    decision = (await route(grant, envelope, evaluator(sandbox_of(ctx)))).decision
    return DryRunOutput(
        webhook_id=data.webhook_id,
        event_id=data.event_id,
        candidate=is_candidate,
        decision=backtest.summarize_decision(decision),
        trace=decision.trace,
        envelope=None if data.omit_envelope else envelope,
    )


@verb(
    "backtest_webhook_rules",
    input=BacktestInput,
    output=BacktestOutput,
    family=FAMILY,
    summary="Replay saved or candidate rules over the webhook's recent events; report what would change.",
    rate_class="authoring",
    hints=READ,
    cli=CliCommand(
        "rules",
        RULES_HELP,
        "backtest",
        "backtest_webhook_rules: replay the saved (or --rules candidate) rules over recent events",
        (
            CliArg("webhook_id", help="the webhook (wh_…)"),
            CliArg("config", "--rules", type="json_file", metavar="FILE", help="candidate: " + CONFIG_HELP),
            CliArg("limit", "--limit", type="int", help="most recent events to replay"),
        ),
        complete="spread_config",
        columns=("event_id", "received_at", "kind", "changed", "rule_changed"),
    ),
)
async def backtest_webhook_rules(ctx: Context, data: BacktestInput) -> BacktestOutput:
    saved = await ctx.services.rules.read(ctx.caller, data.webhook_id)
    grant, is_candidate = await tried_grant(ctx, saved, data)
    # A caller's concurrent backtests run one after another, so one caller cannot fill the verbs' sandbox.
    async with ctx.services.backtests.hold(ctx.caller.endpoint_id):
        result = await backtest.backtest(history_of(ctx), grant, data.limit, evaluator(sandbox_of(ctx)))
    return BacktestOutput(
        webhook_id=data.webhook_id, candidate=is_candidate, events=result.events, summary=result.summary
    )
