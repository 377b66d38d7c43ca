"""Reconciliation against GitHub's delivery log (ReconcileWebhook), through a fake GitHub (tests/github_fake.py)
that keeps a delivery log and redelivers, signed, to the real receiver of a live stack.

Every scenario of the issue: deliveries refused while the API was down are redelivered and routed exactly once;
what Switchboard has (stored, in the inbox, running) is never requested; a redelivery of a pending delivery makes
no second todo; paging and the checkpoint (across runs and across a worker restart: tests/test_faults.py and
``test_the_checkpoint_survives_a_worker_restart`` below); rate limits; a revoked token and a wrong hook as states;
the token in no log, history or answer. The committed histories of the workflow's paths are recorded here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from temporalio.client import ScheduleActionExecutionStartWorkflow, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.reconcile import ReconcileInput, ReconcileResult
from routing.delivery import DeliveryInput, workflow_id_for
from runtime.relay import running_relay
from store.commits import CommitStore
from store.inbox import InboxStore
from tests.conftest import Agent, Stack, running_stack, serving, worker_process_env
from tests.github_fake import Attempt, FakeGitHub, FakeHook, Scripted, fake_github, recording_server
from tests.helpers import eventually, issue_payload, token_of
from tests.workflows.replay import replay_and_keep
from workflows.reconcile import ReconcileWebhook
from workflows.route_delivery import RouteDelivery

# No known token prefix (ghp_, github_pat_…): log masking could not hide it, so the code itself must never log it.
TOKEN = "tok" + secrets.token_hex(20)


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    with fake_github(TOKEN) as fake:
        yield fake


def allow(stack: Stack, github: FakeGitHub) -> None:
    """The operator allows the fake's API URL; redelivery requests are spaced by 10 ms instead of 1 s."""
    stack.settings.reconcile_api_urls = github.url
    stack.settings.reconcile_request_gap_seconds = 0.01


async def reconciled(
    stack: Stack,
    github: FakeGitHub,
    *,
    scope: dict[str, Any] | None = None,
    hook_id: int | None = 12,
    owner: Agent | None = None,
    **extra: Any,
) -> tuple[Agent, dict[str, Any], FakeHook]:
    """An owner's github webhook, its hook on the fake GitHub (posting to the live receiver), and a reconciler.

    The reconciler's schedule is paused: each test starts its runs itself, so no scheduled run joins in.
    """
    allow(stack, github)
    owner = owner or await stack.agent()
    webhook = await owner.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    scope = scope or {"repo": "acme/app"}
    path = "app" if "app" in scope else f"repos/{scope['repo']}" if "repo" in scope else f"orgs/{scope['org']}"
    ingest = f"{stack.base_url}/webhooks/w/{token_of(webhook['ingest_url'])}"
    hook = github.hook(path, ingest, webhook["secret"].encode(), hook_id)
    body = {
        "webhook_id": webhook["webhook_id"],
        "scope": scope,
        "token": TOKEN,
        "api_url": github.url,
        "interval_seconds": 3600,
        **({"hook_id": hook_id} if hook_id is not None else {}),
        **extra,
    }
    out = await owner.ok("set_webhook_reconciler", body)
    schedule = stack.temporal.get_schedule_handle(out["reconciler"]["temporal_schedule_id"])
    await schedule.pause(note="the test starts its runs itself")
    return owner, webhook, hook


async def send(github: FakeGitHub, hook: FakeHook, n: int = 1, **kw: Any) -> list[Attempt]:
    """GitHub sends n issue deliveries (from its own threads: the receiver runs on this test's loop)."""
    out = []
    for i in range(n):
        out.append(await asyncio.to_thread(github.send, hook, issue_payload(number=i + 1), **kw))
    return out


async def idle(github: FakeGitHub) -> None:
    """Wait until the fake sent every redelivery it accepted (off the loop: they post to this loop's receiver)."""
    await asyncio.to_thread(github.wait_idle)


async def run_once(stack: Stack, webhook_id: str) -> tuple[ReconcileResult, WorkflowHandle[Any, ReconcileResult]]:
    """One ReconcileWebhook run, as the schedule starts it, to its end."""
    handle = await stack.temporal.start_workflow(
        ReconcileWebhook.run,
        ReconcileInput(webhook_id=webhook_id),
        id=f"reconcile-{webhook_id}-test-{uuid.uuid4().hex[:8]}",
        task_queue=stack.settings.task_queue,
    )
    return await handle.result(), handle


def routed(stack: Stack, webhook_id: str) -> dict[str, tuple[int, int]]:
    """guid → (events, todos) of the webhook, straight from the tables."""
    rows = stack.sql(
        "SELECT e.external_id, count(DISTINCT e.id), count(t.id) FROM events e LEFT JOIN todos t ON t.event_id = e.id"
        " WHERE e.webhook_id = %s GROUP BY e.external_id",
        webhook_id,
    )
    return {str(r[0]).removeprefix(f"{webhook_id}:"): (int(r[1]), int(r[2])) for r in rows}


async def all_routed(stack: Stack, webhook_id: str, guids: list[str]) -> dict[str, tuple[int, int]]:
    """The webhook's events once every guid has one."""

    def every() -> dict[str, tuple[int, int]] | None:
        found = routed(stack, webhook_id)
        return found if set(guids) <= found.keys() else None

    return await eventually(every, timeout=60)


def sample(name: str, **labels: str) -> float:
    """A counter of this process's registry (the stack's worker runs in it)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def state(owner: Agent, webhook_id: str) -> dict[str, Any]:
    out = await owner.ok("get_webhook_reconciler", {"webhook_id": webhook_id})
    reconciler: dict[str, Any] = out["reconciler"]
    return reconciler


# --- the scenarios ----------------------------------------------------------------------------------------------


async def test_deliveries_refused_while_the_api_was_down_are_redelivered_and_routed_exactly_once(
    live_stack: Stack, github: FakeGitHub
) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    delivered = await send(github, hook, 2)
    refused = await send(github, hook, 3, url=github.dead_url)  # no API process listens: connection refused
    assert [a.status_code for a in delivered + refused] == [202, 202, 0, 0, 0]
    assert set(routed(stack, wid)) == {a.guid for a in delivered}

    before = {o: sample("switchboard_reconcile_deliveries_total", outcome=o) for o in ("seen", "missing", "requested")}
    runs = sample("switchboard_reconcile_runs_total", status="ok")
    first, handle = await run_once(stack, wid)
    assert (first.status, first.seen, first.missing, first.requested, first.present) == ("ok", 5, 3, 3, 0)
    moved = {o: sample("switchboard_reconcile_deliveries_total", outcome=o) - n for o, n in before.items()}
    assert moved == {"seen": 5, "missing": 3, "requested": 3}
    assert sample("switchboard_reconcile_runs_total", status="ok") == runs + 1
    await idle(github)
    found = await all_routed(stack, wid, [a.guid for a in delivered + refused])
    assert found == {a.guid: (1, 1) for a in delivered + refused}  # each exactly once: one event, one todo
    assert github.redelivery_counts() == {a.guid: 1 for a in refused}
    # GitHub logged each redelivery as a new attempt of the same guid, delivered this time.
    again = [a for a in hook.attempts if a.redelivery]
    assert sorted(a.guid for a in again) == sorted(a.guid for a in refused)
    assert all(a.status_code == 202 for a in again)

    second, _ = await run_once(stack, wid)
    # The second run reads only the attempts above the checkpoint (the three redeliveries) and asks for nothing.
    assert (second.status, second.seen, second.missing, second.requested) == ("ok", 3, 0, 0)
    assert first.arrived + second.arrived == 3
    assert github.redelivery_counts() == {a.guid: 1 for a in refused}
    view = await state(owner, wid)
    assert view["status"] == "ok" and view["scanning"] is False
    assert view["checkpoint_id"] == max(a.id for a in hook.attempts)
    assert view["totals"] == {"seen": 8, "missing": 3, "requested": 3, "arrived": 3, "given_up": 0}
    assert view["last_run"]["counts"]["seen"] == 3 and view["requested_open"] == 0 and view["waiting"] == 0
    assert TOKEN not in json.dumps(view) and view["has_token"] is True
    assert routed(stack, wid) == {a.guid: (1, 1) for a in delivered + refused}
    await replay_and_keep(handle, "reconcile_webhook.json")


async def test_deliveries_switchboard_has_stored_inboxed_or_running_are_never_requested(
    live_stack: Stack, github: FakeGitHub, temporal_env: WorkflowEnvironment
) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    # Stored, though GitHub logged a failure (it gave up waiting for the answer).
    stored = (await send(github, hook, recorded_status=0))[0]
    # Waiting in the inbox: the webhook's pace defers the second delivery for about 1000 s.
    stack.settings.webhook_rate_burst = 1
    await stack.admin("set_webhook_rate", {"webhook_id": wid, "rate_per_second": 0.001})
    paced = await send(github, hook, 2, recorded_status=0)
    assert stack.sql("SELECT count(*) FROM delivery_inbox WHERE webhook_id = %s", wid)[0][0] == 1
    inboxed = paced[1]
    # Running in Temporal without an event yet: a RouteDelivery no worker has picked up; GitHub logged no answer.
    running = (await send(github, hook, url=github.dead_url))[0]
    key = f"{wid}:{running.guid}"
    blocker = await stack.temporal.start_workflow(
        RouteDelivery.run,
        DeliveryInput(
            webhook_id=wid,
            endpoint_id=owner.endpoint_id,
            source="github",
            kind="issues",
            external_id=key,
            trust_mode="signed",
            verified=True,
            verify_detail="hmac-sha256",
            content_type="application/json",
            headers={},
            body=b"{}",
            source_ip=None,
            received_at=datetime.now(UTC).isoformat(),
        ),
        id=workflow_id_for(wid, key),
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
    )
    try:
        result, _ = await run_once(stack, wid)
        assert (result.status, result.seen, result.missing, result.requested) == ("ok", 4, 0, 0)
        assert github.redeliveries == [] and github.api_requests("POST") == []

        # GitHub's own "Redeliver" (a person, or another tool) while the original still waits in the inbox:
        # it joins the waiting delivery, and no second todo is ever made.
        redo = await asyncio.to_thread(github.redeliver, hook, inboxed.id)
        assert redo.status_code == 202
        assert stack.sql("SELECT count(*) FROM delivery_inbox WHERE webhook_id = %s", wid)[0][0] == 1
        stack.sql("UPDATE delivery_inbox SET release_at = now() WHERE webhook_id = %s", wid)
        inbox = InboxStore(stack.app.state.services.pool)
        deliveries = CommitStore(stack.app.state.services.pool)
        async with running_relay(temporal_env.client, inbox, deliveries, stack.settings):
            await eventually(lambda: inboxed.guid in routed(stack, wid), timeout=60)
        assert routed(stack, wid) == {stored.guid: (1, 1), paced[0].guid: (1, 1), inboxed.guid: (1, 1)}
    finally:
        await blocker.terminate("test over")


async def test_paging_across_pages_continues_from_the_checkpoint_run_after_run(
    live_stack: Stack, github: FakeGitHub
) -> None:
    stack = live_stack
    github.page_size = 3
    # GitHub's Link header names another host: only its cursor is taken, the token never goes there.
    with recording_server() as (elsewhere, seen_elsewhere):
        github.link_base = elsewhere
        stack.settings.reconcile_pages_max = 2
        owner, webhook, hook = await reconciled(stack, github)
        wid = webhook["webhook_id"]
        refused = await send(github, hook, 8, url=github.dead_url)

        first, _ = await run_once(stack, wid)
        # Two pages of three (the run's page limit): the scan stops there and saves its place.
        assert (first.pages, first.seen, first.missing, first.requested) == (2, 6, 6, 6)
        assert first.scanning is True and first.checkpoint_id is None
        assert (await state(owner, wid))["scanning"] is True
        second, _ = await run_once(stack, wid)
        lists = github.api_requests("GET")
        # The second run started where the first stopped (a cursor), read the last two, and reached the end.
        resumed = lists[2]
        assert resumed.query.get("cursor") == [str(refused[2].id)]
        assert (second.seen, second.missing, second.requested, second.scanning) == (2, 2, 2, False)
        assert second.checkpoint_id == refused[-1].id  # the newest attempt when the scan began
        await idle(github)
        await all_routed(stack, wid, [a.guid for a in refused])

        # New traffic: the next scan reads from the newest attempt down to the checkpoint (the eight redeliveries
        # and the two new deliveries), and no further.
        more = await send(github, hook, 2, url=github.dead_url)
        stack.settings.reconcile_pages_max = 10
        before = len(github.api_requests("GET"))
        third, _ = await run_once(stack, wid)
        assert (third.pages, third.seen, third.missing, third.requested) == (4, 10, 2, 2)
        reads = github.api_requests("GET")[before:]
        assert "cursor" not in reads[0].query  # from the newest
        assert third.checkpoint_id == more[-1].id
        await idle(github)
        found = await all_routed(stack, wid, [a.guid for a in refused + more])
        assert found == {a.guid: (1, 1) for a in refused + more}
        assert github.redelivery_counts() == {a.guid: 1 for a in refused + more}
        assert seen_elsewhere == []
        assert all(r.authorization == f"Bearer {TOKEN}" for r in github.api_requests())


async def test_org_and_app_hooks_are_read_at_their_own_paths(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    owner, org_webhook, org_hook = await reconciled(stack, github, scope={"org": "acme"}, hook_id=7)
    _, app_webhook, app_hook = await reconciled(stack, github, scope={"app": True}, hook_id=None, owner=owner)
    org_refused = await send(github, org_hook, url=github.dead_url)
    app_refused = await send(github, app_hook, url=github.dead_url)
    org_run, _ = await run_once(stack, org_webhook["webhook_id"])
    app_run, _ = await run_once(stack, app_webhook["webhook_id"])
    assert (org_run.requested, app_run.requested) == (1, 1)
    paths = {(r.method, r.path) for r in github.api_requests()}
    assert paths == {
        ("GET", "/orgs/acme/hooks/7/deliveries"),
        ("POST", f"/orgs/acme/hooks/7/deliveries/{org_refused[0].id}/attempts"),
        ("GET", "/app/hook/deliveries"),
        ("POST", f"/app/hook/deliveries/{app_refused[0].id}/attempts"),
    }
    await idle(github)
    await all_routed(stack, org_webhook["webhook_id"], [org_refused[0].guid])
    await all_routed(stack, app_webhook["webhook_id"], [app_refused[0].guid])


async def test_429_with_retry_after_is_waited_out_with_a_timer(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    _owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    refused = await send(github, hook, 2, url=github.dead_url)
    github.script.append(Scripted(429, {"Retry-After": "2"}, {"message": "rate limited"}, only="GET"))
    result, handle = await run_once(stack, wid)
    assert (result.status, result.waits, result.requested) == ("ok", 1, 2)
    lists = github.api_requests("GET")
    assert len(lists) == 2 and lists[1].at - lists[0].at >= 2.0  # no call before Retry-After passed
    history = await handle.fetch_history()
    timers = [e for e in history.events if e.HasField("timer_started_event_attributes")]
    assert len(timers) == 1 and timers[0].timer_started_event_attributes.start_to_fire_timeout.seconds == 2
    await idle(github)
    await all_routed(stack, wid, [a.guid for a in refused])
    await replay_and_keep(handle, "reconcile_webhook_rate_limited.json")


async def test_a_secondary_rate_limit_on_a_redelivery_request_is_honoured(
    live_stack: Stack, github: FakeGitHub
) -> None:
    stack = live_stack
    _owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    refused = await send(github, hook, 3, url=github.dead_url)
    secondary = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}
    github.script.append(Scripted(403, {"Retry-After": "1"}, secondary, only="POST"))
    result, _ = await run_once(stack, wid)
    assert (result.status, result.waits, result.requested) == ("ok", 1, 3)
    posts = github.api_requests("POST")
    assert len(posts) == 4  # the refused one, then all three
    assert posts[1].at - posts[0].at >= 1.0
    assert github.redelivery_counts() == {a.guid: 1 for a in refused}  # the refused call asked GitHub for nothing
    await idle(github)
    await all_routed(stack, wid, [a.guid for a in refused])


async def test_deliveries_github_will_not_redeliver_are_given_up(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    refused = await send(github, hook, 2, url=github.dead_url)
    # GitHub refuses one redelivery (the oldest is asked for first): given up, the other one goes ahead.
    github.script.append(Scripted(422, {}, {"message": "Validation Failed"}, only="POST"))
    given_up = sample("switchboard_reconcile_deliveries_total", outcome="given_up")
    result, _ = await run_once(stack, wid)
    assert (result.status, result.requested, result.given_up) == ("ok", 1, 1)
    assert github.redelivery_counts() == {refused[1].guid: 1}
    # A missing delivery first tried before the lookback is given up too: GitHub no longer redelivers it.
    late = await send(github, hook, 1, url=github.dead_url)
    stack.settings.reconcile_redeliveries_max = 0
    await run_once(stack, wid)
    stack.sql(
        "UPDATE webhook_reconcile_deliveries SET first_at = now() - interval '73 hours' WHERE guid = %s", late[0].guid
    )
    stack.settings.reconcile_redeliveries_max = 50
    expired, _ = await run_once(stack, wid)
    assert (expired.given_up, expired.requested) == (1, 0)
    view = await state(owner, wid)
    assert (view["totals"]["requested"], view["totals"]["given_up"]) == (1, 2)
    assert sample("switchboard_reconcile_deliveries_total", outcome="given_up") == given_up + 2
    await idle(github)
    await all_routed(stack, wid, [refused[1].guid])


async def test_a_request_noted_but_never_made_is_asked_again_later(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    _owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    lost = (await send(github, hook, 1, url=github.dead_url))[0]
    # A run noted the request, then its worker died before the call: GitHub never heard of it.
    stack.settings.reconcile_redeliveries_max = 0
    await run_once(stack, wid)
    stack.sql(
        "UPDATE webhook_reconcile_deliveries SET state = 'requested', requests = 1, requested_attempt_id = attempt_id,"
        " requested_at = now() - interval '11 hours' WHERE guid = %s",
        lost.guid,
    )
    stack.settings.reconcile_redeliveries_max = 50
    result, _ = await run_once(stack, wid)
    assert result.requested == 1 and github.redelivery_counts() == {lost.guid: 1}
    await idle(github)
    assert (await all_routed(stack, wid, [lost.guid]))[lost.guid] == (1, 1)


async def test_a_long_rate_limit_ends_the_run_and_later_runs_wait_without_calling(
    live_stack: Stack, github: FakeGitHub
) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    await send(github, hook, 1, url=github.dead_url)
    reset = int(time.time()) + 3600
    github.script.append(
        Scripted(
            403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}, {"message": "API rate limit exceeded"}
        )
    )
    first, _ = await run_once(stack, wid)
    assert first.status == "rate_limited" and first.requested == 0
    view = await state(owner, wid)
    assert view["status"] == "rate_limited"
    until = datetime.fromisoformat(view["backoff_until"]).timestamp()
    assert reset - 60 < until < reset + 60
    calls = len(github.api_requests())
    second, _ = await run_once(stack, wid)
    assert second.status == "rate_limited" and len(github.api_requests()) == calls  # not one call meanwhile
    # The primary window's reset, on a successful answer, holds the next call too.
    stack.sql("UPDATE webhook_reconcilers SET backoff_until = NULL WHERE webhook_id = %s", wid)
    # The real answer, with GitHub saying the window is spent until two seconds from now.
    github.script.append(Scripted(0, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 2)}))
    third, _ = await run_once(stack, wid)
    assert third.status == "ok" and third.waits == 1 and third.requested == 1


async def test_a_revoked_token_a_wrong_hook_and_github_down_are_visible_states_and_ingest_goes_on(
    live_stack: Stack, github: FakeGitHub
) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    github.token = "another-token"  # the owner's token was revoked on GitHub
    runs = sample("switchboard_reconcile_runs_total", status="unauthorized")
    calls = sample("switchboard_reconcile_api_calls_total", call="list", outcome="unauthorized")
    result, handle = await run_once(stack, wid)
    assert (result.status, result.pages) == ("unauthorized", 1)
    assert sample("switchboard_reconcile_runs_total", status="unauthorized") == runs + 1
    assert sample("switchboard_reconcile_api_calls_total", call="list", outcome="unauthorized") == calls + 1
    view = await state(owner, wid)
    assert view["status"] == "unauthorized" and "401" in view["status_detail"]
    await replay_and_keep(handle, "reconcile_webhook_unauthorized.json")
    # Ingest is untouched: GitHub's next delivery is routed as ever.
    live = await send(github, hook)
    assert live[0].status_code == 202 and routed(stack, wid) == {live[0].guid: (1, 1)}

    # GitHub down: an outage state, the next run tries again.
    github.token = TOKEN
    github.script.append(Scripted(502, {}, {"message": "Server Error"}))
    down, _ = await run_once(stack, wid)
    assert down.status == "unavailable" and (await state(owner, wid))["status"] == "unavailable"
    back, _ = await run_once(stack, wid)
    assert back.status == "ok" and (await state(owner, wid))["status"] == "ok"

    _, other, _ = await reconciled(stack, github, owner=owner, hook_id=99)
    stack.sql("UPDATE webhook_reconcilers SET hook_id = 404 WHERE webhook_id = %s", other["webhook_id"])
    wrong, _ = await run_once(stack, other["webhook_id"])
    assert wrong.status == "not_found"
    assert (await state(owner, other["webhook_id"]))["status"] == "not_found"


async def test_redirects_are_refused_and_the_token_reaches_no_other_host(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    _owner, webhook, _hook = await reconciled(stack, github)
    with recording_server() as (elsewhere, seen):
        github.script.append(Scripted(302, {"Location": f"{elsewhere}/stolen"}))
        result, _ = await run_once(stack, webhook["webhook_id"])
    assert result.status == "error" and "redirect" in result.detail
    assert seen == []


async def test_the_token_never_appears_in_logs_history_or_answers(
    live_stack: Stack, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    stack = live_stack
    caplog.set_level(logging.DEBUG)
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    await send(github, hook, 2, url=github.dead_url)
    ok, ok_handle = await run_once(stack, wid)
    github.token = "revoked"
    bad, bad_handle = await run_once(stack, wid)
    assert (ok.status, ok.requested, bad.status) == ("ok", 2, "unauthorized")
    answers = [
        await owner.call("get_webhook_reconciler", {"webhook_id": wid}),
        await owner.call(
            "set_webhook_reconciler",
            {"webhook_id": wid, "scope": {"repo": "acme/app"}, "hook_id": 12, "api_url": github.url},
        ),
    ]
    histories = [(await h.fetch_history()).to_json() for h in (ok_handle, bad_handle)]
    stored = stack.sql("SELECT token_ciphertext::text, last_run::text, status_detail FROM webhook_reconcilers")
    for text in [*(a.text for a in answers), *histories, caplog.text, repr(stored)]:
        assert TOKEN not in text
    assert all(a.status_code == 200 for a in answers)
    assert "reconciler run ended: unauthorized" in caplog.text  # the runs were logged, without the token


async def test_a_deleted_webhook_ends_its_reconciler_and_its_schedule(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    owner, webhook, _ = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    schedule_id = (await state(owner, wid))["temporal_schedule_id"]
    await owner.ok("delete_webhook", {"webhook_id": wid})
    assert stack.sql("SELECT count(*) FROM webhook_reconcilers WHERE webhook_id = %s", wid)[0][0] == 0
    result, handle = await run_once(stack, wid)
    assert result.status == "gone" and github.api_requests() == []
    schedules = [s.id async for s in await stack.temporal.list_schedules()]
    assert schedule_id not in schedules
    await replay_and_keep(handle, "reconcile_webhook_gone.json")


async def test_the_operator_switch_stops_every_run(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    await send(github, hook, 1, url=github.dead_url)
    stack.settings.reconcile = False
    result, _ = await run_once(stack, webhook["webhook_id"])
    assert result.status == "disabled" and github.api_requests() == []
    out = await owner.ok("get_webhook_reconciler", {"webhook_id": webhook["webhook_id"]})
    assert out["enabled"] is False


async def test_the_schedule_starts_runs(live_stack: Stack, github: FakeGitHub) -> None:
    stack = live_stack
    owner, webhook, hook = await reconciled(stack, github)
    wid = webhook["webhook_id"]
    refused = await send(github, hook, 1, url=github.dead_url)
    schedule = stack.temporal.get_schedule_handle((await state(owner, wid))["temporal_schedule_id"])
    await schedule.unpause()
    desc = await schedule.describe()
    assert desc.schedule.spec.intervals[0].every.total_seconds() == 3600
    await schedule.trigger()

    async def started() -> str | None:
        actions = (await schedule.describe()).info.recent_actions
        if not actions:
            return None
        action = actions[0].action
        assert isinstance(action, ScheduleActionExecutionStartWorkflow)
        return action.workflow_id

    workflow_id = await eventually(started, timeout=60)
    assert workflow_id.startswith(f"reconcile-{wid}")
    result = await stack.temporal.get_workflow_handle(workflow_id, result_type=ReconcileResult).result()
    assert result.requested == 1
    await idle(github)
    await all_routed(stack, wid, [refused[0].guid])


async def test_the_checkpoint_survives_a_worker_restart(
    tmp_path: Path, database_url: str, temporal_env: WorkflowEnvironment, sandbox: Any, github: FakeGitHub
) -> None:
    """A real `switchboard worker` process is SIGKILLed while a run waits out a rate limit, with one page of the
    scan done and saved; the next worker finishes the run from its history and its saved cursor, and each
    missing delivery is requested and routed once."""
    github.page_size = 3
    async with running_stack(tmp_path, database_url, temporal_env.client, sandbox, with_worker=False) as stack:
        async with serving(stack.app) as base:
            stack.base_url = base
            owner, webhook, hook = await reconciled(stack, github)
            wid = webhook["webhook_id"]
            refused = await send(github, hook, 5, url=github.dead_url)
            env = worker_process_env(
                stack,
                tmp_path / "worker-home",
                SWITCHBOARD_RECONCILE_API_URLS=github.url,
                SWITCHBOARD_RECONCILE_REQUEST_GAP_SECONDS="0.01",
            )

            def start_worker(name: str) -> subprocess.Popen[bytes]:
                log = (tmp_path / f"{name}.log").open("wb")
                return subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "worker"],
                    env=env,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )

            # The second page answers 429: the run waits 8 s on a timer, and its worker is killed meanwhile.
            github.script.append(Scripted(429, {"Retry-After": "8"}, {"message": "slow down"}, only="GET", after=1))
            first = start_worker("first")
            try:
                handle = await stack.temporal.start_workflow(
                    ReconcileWebhook.run,
                    ReconcileInput(webhook_id=wid),
                    id=f"reconcile-{wid}-restart",
                    task_queue=stack.settings.task_queue,
                )

                async def waiting() -> bool:
                    history = await handle.fetch_history()
                    return any(e.HasField("timer_started_event_attributes") for e in history.events)

                await eventually(waiting, timeout=120)
                saved = stack.sql("SELECT scan_cursor, scan_top_id FROM webhook_reconcilers WHERE webhook_id = %s", wid)
                assert saved == [(str(refused[2].id), refused[-1].id)]
            finally:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
            second = start_worker("second")
            try:
                result = await asyncio.wait_for(handle.result(), 120)
                await idle(github)
                found = await all_routed(stack, wid, [a.guid for a in refused])
            finally:
                second.terminate()
                try:
                    second.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    second.kill()
                    second.wait()
            assert (result.status, result.waits, result.pages, result.seen, result.requested) == ("ok", 1, 2, 5, 5)
            lists = github.api_requests("GET")
            assert [r.query.get("cursor") for r in lists] == [None, [str(refused[2].id)], [str(refused[2].id)]]
            assert found == {a.guid: (1, 1) for a in refused}
            assert github.redelivery_counts() == {a.guid: 1 for a in refused}
            logs = [(tmp_path / f"{name}.log").read_text() for name in ("first", "second")]
            assert "reconciler run ended: ok" in logs[1] and all(TOKEN not in text for text in logs)
            view = await state(owner, wid)
            assert view["checkpoint_id"] == refused[-1].id and view["scanning"] is False
