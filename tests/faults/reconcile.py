"""The reconciler's row: the API down while a fake GitHub sends, then the webhook's reconciler has GitHub redeliver
what was refused."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

import httpx

from tests.faults.counts import Counts
from tests.faults.producers import issue_body
from tests.faults.stack import FaultStack, Hook
from tests.faults.tally import Outcome, _events_by_delivery
from tests.github_fake import FakeGitHub, fake_github

# --------------------------------------------------------------------------------------------- reconciliation

RECONCILE_INTERVAL = 10  # seconds between a reconciler's runs in the reconcile row
RECONCILE_VERBS = (
    "create_webhook",
    "claim_next",
    "set_webhook_reconciler",
    "get_webhook_reconciler",
    "clear_webhook_reconciler",
)


def _allow_github(stack: FaultStack, url: str) -> None:
    """Restart every API and worker process allowing the fake GitHub's API URL and a 10 s reconcile interval."""
    extra = {
        "SWITCHBOARD_RECONCILE_API_URLS": url,
        "SWITCHBOARD_RECONCILE_INTERVAL_MIN_SECONDS": str(RECONCILE_INTERVAL),
        "SWITCHBOARD_RECONCILE_REQUEST_GAP_SECONDS": "0.05",
    }
    for proc in stack.workers:
        proc.env.update(extra)
        proc.stop()
        stack.start_worker(proc)
    for proc in stack.apis:
        proc.env.update(extra)
        proc.stop()
        stack.start_api(proc)


def _owner_call(stack: FaultStack, hook: Hook, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = httpx.post(
        f"{stack.base(stack.apis[0])}/v1/{verb}",
        json=body,
        headers={"Authorization": f"Bearer {hook.credential}"},
        timeout=30,
    )
    resp.raise_for_status()
    out: dict[str, Any] = resp.json()
    return out


async def _github_sends(github: FakeGitHub, hook: Any, counts: Counts, stop: asyncio.Event) -> None:
    """`senders` GitHub deliveries at a time, one every `interval` s each, until stopped (never retried)."""

    async def sender(k: int) -> None:
        n = k
        while not stop.is_set():
            await asyncio.to_thread(github.send, hook, issue_body(n, f"reconcile-{n}"))
            n += counts.senders
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), counts.interval)

    await asyncio.gather(*(sender(k) for k in range(counts.senders)))


async def api_down_then_reconcile(stack: FaultStack, counts: Counts) -> Outcome:
    """GitHub sends while the (one) API process is stopped for `api_down` s, then the webhook's reconciler (every
    10 s, a Temporal Schedule) has GitHub redeliver what was refused. **lost** counts every delivery GitHub sent
    that has no event, refused ones included; **other** the refused connections."""
    name = f"API down {counts.api_down:.0f} s, reconcile"
    token = "fake-" + secrets.token_hex(16)
    with fake_github(token) as github:
        await asyncio.to_thread(_allow_github, stack, github.url)
        hook = await asyncio.to_thread(stack.hook, "reconcile", RECONCILE_VERBS)
        api = stack.apis[0]
        ingest = f"{stack.base(api)}/webhooks/w/{hook.token}"
        fake_hook = github.hook("repos/acme/app", ingest, hook.secret, 1)
        await asyncio.to_thread(
            _owner_call,
            stack,
            hook,
            "set_webhook_reconciler",
            {
                "webhook_id": hook.webhook_id,
                "scope": {"repo": "acme/app"},
                "hook_id": 1,
                "token": token,
                "api_url": github.url,
                "interval_seconds": RECONCILE_INTERVAL,
            },
        )
        crashes = len(stack.crashes)
        stop = asyncio.Event()
        sending = asyncio.create_task(_github_sends(github, fake_hook, counts, stop))
        try:
            await asyncio.sleep(counts.lead)
            began = time.time()
            await asyncio.to_thread(api.stop)
            await asyncio.sleep(counts.api_down)
            await asyncio.to_thread(stack.start_api, api)
            back = time.time()
            await asyncio.sleep(counts.tail)
        finally:
            stop.set()
            await sending
        originals = [a for a in fake_hook.attempts if not a.redelivery]
        sent = {a.guid for a in originals}
        deadline = time.monotonic() + 300
        seen: dict[str, tuple[int, float, int]] = {}
        while time.monotonic() < deadline:
            seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
            if sent <= seen.keys():
                break
            await asyncio.sleep(1.0)
        await asyncio.sleep(2.0)  # settle: a late redelivery would show as doubled
        seen = await asyncio.to_thread(_events_by_delivery, stack, hook)
        state = await asyncio.to_thread(
            _owner_call, stack, hook, "get_webhook_reconciler", {"webhook_id": hook.webhook_id}
        )
        await asyncio.to_thread(_owner_call, stack, hook, "clear_webhook_reconciler", {"webhook_id": hook.webhook_id})
    out = Outcome(name)
    out.sent = len(originals)
    for a in originals:
        if a.status_code == 202:
            out.accepted += 1
        elif a.status_code == 503:
            out.unavailable += 1
        elif a.status_code == 0:
            out.other["no answer (refused)"] += 1
        else:
            out.other[str(a.status_code)] += 1
    out.lost = len(sent - seen.keys())
    out.doubled = sum(1 for n, _, todos in seen.values() if n > 1 or todos > 1)
    out.events = sum(v[0] for v in seen.values())
    out.todos = await asyncio.to_thread(
        stack.count, "SELECT count(*) FROM todos WHERE endpoint_id = %s", hook.endpoint_id
    )
    refused = {a.guid for a in originals if a.status_code != 202}
    landed = [seen[g][1] for g in refused if g in seen]
    out.recovery = max(0.0, max(landed, default=back) - back)
    out.crashes = len(stack.crashes) - crashes
    reconciler = state["reconciler"] or {}
    totals = reconciler.get("totals", {})
    out.notes.append(
        f"API down {back - began:.1f} s; refused {len(refused)}, redelivered by GitHub on request and routed"
        f" {len(refused & seen.keys())}; reconciler totals {totals}, status {reconciler.get('status')}; redelivery"
        f" requests {len(github.redeliveries)} for {len(github.redelivery_counts())} guids"
    )
    if out.lost:
        out.notes.append(f"lost ids (first 5): {', '.join(sorted(sent - seen.keys())[:5])}")
    return out
