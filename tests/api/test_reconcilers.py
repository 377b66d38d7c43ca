"""The reconciler verbs: owner-gated, validated at save (a refusal changes nothing), the token sealed and never
returned, one Temporal Schedule per reconciler, the operator's switch and bounds, the CLI commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.service import RPCError

from runtime.reconcilers import PAUSED_NOTE, sync_schedules
from store.reconcile_ledger import ReconcileLedger
from tests.conftest import Agent, Stack
from tests.test_cli import run_agent
from tests.workflows.test_reconcile import TOKEN

API_URL = "https://ghe.example/api/v3"


def allow(stack: Stack) -> None:
    stack.settings.reconcile_api_urls = f"https://api.github.com, {API_URL}"


async def github_webhook(owner: Agent, source_type: str = "github") -> str:
    made = await owner.ok("create_webhook", {"source_type": source_type, "target_queue": "work"})
    return str(made["webhook_id"])


def body(webhook_id: str, **kw: Any) -> dict[str, Any]:
    return {
        "webhook_id": webhook_id,
        "scope": {"repo": "acme/app"},
        "hook_id": 12,
        "token": TOKEN,
        "api_url": API_URL,
        "interval_seconds": 600,
        **kw,
    }


def rows(stack: Stack) -> int:
    return int(stack.sql("SELECT count(*) FROM webhook_reconcilers")[0][0])


async def schedule_of(stack: Stack, schedule_id: str) -> Any:
    return await stack.temporal.get_schedule_handle(schedule_id).describe()


async def test_set_get_and_clear_one_schedule_per_reconciler(stack: Stack) -> None:
    allow(stack)
    owner = await stack.agent()
    wid = await github_webhook(owner)
    out = await owner.ok("set_webhook_reconciler", body(wid, lookback_hours=24))
    rec = out["reconciler"]
    assert out["enabled"] is True
    assert (rec["scope"], rec["hook_id"], rec["api_url"], rec["interval_seconds"], rec["lookback_hours"]) == (
        {"repo": "acme/app"},
        12,
        API_URL,
        600,
        24,
    )
    assert (rec["status"], rec["has_token"], rec["checkpoint_id"], rec["last_run"]) == ("pending", True, None, None)
    assert rec["temporal_schedule_id"] == f"switchboard-reconcile-{wid}"
    desc = await schedule_of(stack, rec["temporal_schedule_id"])
    assert [i.every.total_seconds() for i in desc.schedule.spec.intervals] == [600]
    assert desc.schedule.action.workflow == "ReconcileWebhook" and desc.schedule.state.paused is False
    attrs = {k.name: v for k, v in desc.schedule.action.typed_search_attributes}
    assert attrs == {"SwitchboardWebhookId": wid, "SwitchboardSource": "github"}
    # The token: sealed at rest, never in an answer.
    for answer in (out, await owner.ok("get_webhook_reconciler", {"webhook_id": wid})):
        assert TOKEN not in str(answer)
    sealed = stack.sql("SELECT token_ciphertext FROM webhook_reconcilers WHERE webhook_id = %s", wid)[0][0]
    assert TOKEN.encode() not in bytes(sealed)

    # A replace without a token keeps the stored one and moves the schedule to the new interval.
    again = await owner.ok("set_webhook_reconciler", {**body(wid, interval_seconds=900), "token": None})
    assert again["reconciler"]["interval_seconds"] == 900
    assert stack.sql("SELECT token_ciphertext FROM webhook_reconcilers")[0][0] == sealed
    desc = await schedule_of(stack, rec["temporal_schedule_id"])
    assert [i.every.total_seconds() for i in desc.schedule.spec.intervals] == [900]

    cleared = await owner.ok("clear_webhook_reconciler", {"webhook_id": wid})
    assert cleared == {"webhook_id": wid, "cleared": True}
    assert rows(stack) == 0
    with pytest.raises(RPCError):
        await schedule_of(stack, rec["temporal_schedule_id"])
    assert (await owner.ok("clear_webhook_reconciler", {"webhook_id": wid}))["cleared"] is False
    assert (await owner.ok("get_webhook_reconciler", {"webhook_id": wid}))["reconciler"] is None


async def test_another_tenants_webhook_is_not_found_like_an_unknown_one(stack: Stack) -> None:
    allow(stack)
    owner = await stack.agent()
    wid = await github_webhook(owner)
    await owner.ok("set_webhook_reconciler", body(wid))
    stranger = await stack.agent()
    for verb, extra in [
        ("set_webhook_reconciler", body(wid)),
        ("get_webhook_reconciler", {}),
        ("clear_webhook_reconciler", {}),
    ]:
        answers = []
        for webhook_id in (wid, "wh_" + "0" * 24):
            resp = await stranger.call(verb, {**extra, "webhook_id": webhook_id})
            answers.append((resp.status_code, resp.json()))
        assert answers[0] == answers[1] and answers[0][0] == 404, verb
    assert rows(stack) == 1
    # Another endpoint of the same human manages it, as with every rule verb.
    colleague = await stack.agent(owner.human_id)
    assert (await colleague.ok("get_webhook_reconciler", {"webhook_id": wid}))["reconciler"] is not None


async def test_bad_input_is_refused_with_a_stable_code_and_changes_nothing(stack: Stack) -> None:
    allow(stack)
    stack.settings.reconcile_interval_min_seconds = 120
    owner = await stack.agent()
    wid = await github_webhook(owner)
    gitea = await github_webhook(owner, "gitea")
    cases = [
        (body(gitea), 422, "invalid_argument"),  # GitHub keeps no log of a Gitea webhook's deliveries
        (body(wid, api_url="https://evil.example"), 422, "invalid_argument"),  # not an operator-allowed URL
        (body(wid, api_url="https://user:pw@ghe.example/api/v3"), 422, "invalid_argument"),
        (body(wid, lookback_hours=73), 422, "invalid_argument"),  # past GitHub's redelivery window
        (body(wid, interval_seconds=60), 422, "invalid_argument"),  # under the operator's minimum
        (body(wid, scope={"repo": "acme/app", "org": "acme"}), 422, "invalid_argument"),
        (body(wid, scope={"repo": "no-slash"}), 422, "invalid_argument"),
        (body(wid, scope={"app": True}), 422, "invalid_argument"),  # the app's hook has no hook id
        (body(wid, hook_id=None), 422, "invalid_argument"),
        (body(wid, token=None), 422, "invalid_argument"),  # a new reconciler needs a token
        (body(wid, token="has space"), 422, "invalid_argument"),
        (body(wid, extra=1), 422, "invalid_argument"),
    ]
    for sent, status, code in cases:
        resp = await owner.call("set_webhook_reconciler", sent)
        assert (resp.status_code, resp.json()["error"]["code"]) == (status, code), sent
        assert TOKEN not in resp.text
    assert rows(stack) == 0
    assert [s async for s in await stack.temporal.list_schedules() if s.id.endswith(wid)] == []
    # A stored token never follows the configuration to another API URL.
    await owner.ok("set_webhook_reconciler", body(wid, interval_seconds=120))
    resp = await owner.call("set_webhook_reconciler", {**body(wid, api_url="https://api.github.com"), "token": None})
    assert (resp.status_code, resp.json()["error"]["code"]) == (422, "invalid_argument")
    assert stack.sql("SELECT api_url FROM webhook_reconcilers")[0][0] == API_URL


async def test_reconciler_verbs_follow_the_allowlist(stack: Stack) -> None:
    allow(stack)
    owner = await stack.agent()
    wid = await github_webhook(owner)
    narrow = await stack.agent(owner.human_id, verbs=["get_webhook_reconciler"])
    resp = await narrow.call("set_webhook_reconciler", body(wid))
    assert (resp.status_code, resp.json()["error"]["code"]) == (403, "forbidden")
    assert (await narrow.ok("get_webhook_reconciler", {"webhook_id": wid}))["reconciler"] is None


async def test_the_operator_switch_pauses_every_schedule_and_lifts_only_its_own_pause(stack: Stack) -> None:
    allow(stack)
    owner = await stack.agent()
    stack.settings.reconcile = False
    wid = await github_webhook(owner)
    out = await owner.ok("set_webhook_reconciler", body(wid))
    assert out["enabled"] is False
    schedule_id = out["reconciler"]["temporal_schedule_id"]
    assert (await schedule_of(stack, schedule_id)).schedule.state.paused is True
    owners = stack.app.state.services.reconcilers
    ledger = ReconcileLedger(owners.pool, owners.box)  # what a worker reads its schedules from
    stack.settings.reconcile = True
    await sync_schedules(stack.temporal, ledger, stack.settings)  # a worker starting with the switch on
    assert (await schedule_of(stack, schedule_id)).schedule.state.paused is False
    stack.settings.reconcile = False
    await sync_schedules(stack.temporal, ledger, stack.settings)
    state = (await schedule_of(stack, schedule_id)).schedule.state
    assert (state.paused, state.note) == (True, PAUSED_NOTE)
    # A pause an operator set by hand stays when the switch comes back on.
    handle = stack.temporal.get_schedule_handle(schedule_id)
    await handle.unpause()
    await handle.pause(note="held by hand")
    stack.settings.reconcile = True
    await sync_schedules(stack.temporal, ledger, stack.settings)
    assert (await schedule_of(stack, schedule_id)).schedule.state.paused is True
    # A schedule lost in Temporal is made again.
    await handle.delete()
    await sync_schedules(stack.temporal, ledger, stack.settings)
    assert [i.every.total_seconds() for i in (await schedule_of(stack, schedule_id)).schedule.spec.intervals] == [600]


def test_the_reconciler_commands_send_their_verbs_input(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    assert run_agent(
        monkeypatch, "reconciler", "set", "wh_1", "--repo", "acme/app", "--hook-id", "12", "--token-file", str(token)
    ) == (
        "set_webhook_reconciler",
        {"webhook_id": "wh_1", "scope": {"repo": "acme/app"}, "hook_id": 12, "token": TOKEN},
    )
    assert run_agent(
        monkeypatch, "reconciler", "set", "wh_1", "--app", "--api-url", API_URL, "--interval", "600", "--lookback", "24"
    ) == (
        "set_webhook_reconciler",
        {
            "webhook_id": "wh_1",
            "scope": {"app": True},
            "api_url": API_URL,
            "interval_seconds": 600,
            "lookback_hours": 24,
        },
    )
    assert run_agent(monkeypatch, "reconciler", "get", "wh_1") == ("get_webhook_reconciler", {"webhook_id": "wh_1"})
    assert run_agent(monkeypatch, "reconciler", "clear", "wh_1") == ("clear_webhook_reconciler", {"webhook_id": "wh_1"})
