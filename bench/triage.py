"""LLM triage quality: a labeled set of issue titles through switchboard's own triage prompt, schema and client.

Any OpenAI-compatible provider (a llama.cpp server, Ollama, vLLM, a hosted API): each of the labeled GitHub
issues below is projected as a delivery's triage call sees it (``routing.triage.projection``), asked with the
same instructions and answer schema (``routing.triage``), through the one provider client
(``switchboard.llm.chat_json``) with the triage activity's token cap, one call at a time, then judged exactly
as RouteDelivery judges it (``routing.triage.judge``, threshold 0). It prints the accuracy, the rate at which
the model answered the first listed queue, the accuracy of always answering the first listed queue (the floor
any useful model must clear), the distribution of answers and outcomes, and the latency per call.

    python bench/triage.py --base-url http://127.0.0.1:8080/v1 --model local [--api-key …] [--timeout 30]

A model is worth offering for triage only well above the floor (switchboard's bar: +0.3 accuracy).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.triage import ANSWER_MAX_TOKENS
from bench._stack import percentile
from routing.models import TriageConfig, TriageQueue
from routing.triage import SCHEMA_NAME, TriageResult, answer_schema, instructions, judge, projection
from switchboard.llm import LlmError, Provider, chat_json
from tests.helpers import issue_payload

# Listed in this order: the first listed queue is "bugs".
QUEUES = [
    TriageQueue(queue="bugs", description="software defects: crashes, errors, wrong results, broken builds"),
    TriageQueue(queue="features", description="requests for new functionality or an enhancement of existing behaviour"),
    TriageQueue(queue="docs", description="documentation: missing, wrong or unclear docs, README, guides, examples"),
    TriageQueue(
        queue="security", description="vulnerabilities, leaked secrets, authentication or permission weaknesses"
    ),
]

# (title, the queue a maintainer would pick): six per queue, in no particular order.
LABELED: list[tuple[str, str]] = [
    ("App crashes with a segmentation fault when opening a large file", "bugs"),
    ("Add a dark mode to the settings page", "features"),
    ("README install instructions reference a command that no longer exists", "docs"),
    ("SQL injection in the search endpoint's sort parameter", "security"),
    ("Export to CSV produces an empty file", "bugs"),
    ("Support exporting reports as PDF", "features"),
    ("Typo in the getting started guide: 'recieve'", "docs"),
    ("API tokens are written to the debug log in plain text", "security"),
    ("TypeError: cannot read property 'id' of undefined on the login page", "bugs"),
    ("Allow filtering the issue list by label", "features"),
    ("Document the configuration options of the webhook module", "docs"),
    ("Password reset link never expires and can be reused", "security"),
    ("The build fails on Windows since the last release", "bugs"),
    ("Feature request: keyboard shortcuts for navigation", "features"),
    ("The API reference page is missing examples for pagination", "docs"),
    ("Users can read other users' private projects by changing the id in the URL", "security"),
    ("Totals in the monthly report are off by one day", "bugs"),
    ("It would be great to have a webhook for new comments", "features"),
    ("Broken link to the contributing guide in the docs sidebar", "docs"),
    ("Cross-site scripting through an unescaped user display name", "security"),
    ("Memory leak: the worker's memory grows until it is killed", "bugs"),
    ("Add an option to schedule reports weekly", "features"),
    ("The tutorial's code sample does not match the current API", "docs"),
    ("Session cookie is missing the Secure and HttpOnly flags", "security"),
]


def config(model: str) -> TriageConfig:
    """The triage stage the bench asks as: the four described queues, threshold 0 (every answer counts)."""
    return TriageConfig(provider="bench", model=model, queues=QUEUES, threshold=0.0, per_minute=1, per_day=1)


async def ask(provider: Provider, stage: TriageConfig, title: str, seconds: float) -> tuple[TriageResult, float]:
    """One labeled issue through the triage call, as the activity makes it; its result and seconds taken."""
    envelope = {"source": "github", "kind": "issues", "size": 900, "payload": issue_payload(title=title)}
    data = json.dumps(projection(envelope), ensure_ascii=False, sort_keys=True)
    started = time.perf_counter()
    try:
        answer = await chat_json(
            provider,
            stage.model,
            instructions=instructions(stage),
            data=data,
            schema=answer_schema(stage),
            schema_name=SCHEMA_NAME,
            timeout_seconds=seconds,
            max_tokens=ANSWER_MAX_TOKENS,
        )
        result = TriageResult(outcome="answered", provider=provider.name, model=stage.model, answer=answer)
    except LlmError as exc:
        result = TriageResult(outcome=exc.cause, provider=provider.name, model=stage.model, detail=exc.message)
    return result, time.perf_counter() - started


async def run(provider: Provider, model: str, seconds: float) -> dict[str, Any]:
    """Every labeled issue, one call at a time; per issue the label, the answer and the outcome."""
    stage = config(model)
    granted = stage.queue_names()
    rows = []
    for title, label in LABELED:
        result, took = await ask(provider, stage, title, seconds)
        verdict = judge(stage, result, granted)
        answered = (verdict.record.get("answer") or {}).get("queue")
        rows.append(
            {
                "title": title,
                "label": label,
                "answer": answered,
                "outcome": verdict.record["outcome"],
                "detail": verdict.record.get("detail"),
                "s": took,
            }
        )
    return {"rows": rows}


def report(rows: list[dict[str, Any]], model: str, base_url: str) -> None:
    """Accuracy against the labels, the first-listed-queue floor, and what the model answered."""
    first = QUEUES[0].queue
    n = len(rows)
    correct = sum(1 for r in rows if r["outcome"] == "chosen" and r["answer"] == r["label"])
    first_rate = sum(1 for r in rows if r["answer"] == first) / n
    floor = sum(1 for _, label in LABELED if label == first) / n
    accuracy = correct / n
    seconds = [r["s"] for r in rows]
    print(f"\ntriage bench: {n} labeled issue titles, {len(QUEUES)} described queues, model {model!r} at {base_url}")
    print(f"  {'title':<72} {'label':<9} {'answer':<9} outcome")
    for r in rows:
        print(f"  {r['title'][:72]:<72} {r['label']:<9} {r['answer'] or '-':<9} {r['outcome']}")
    answers = collections.Counter(r["answer"] or "(none)" for r in rows)
    outcomes = collections.Counter(r["outcome"] for r in rows)
    print(f"\n  accuracy                              {accuracy:.2f}  ({correct}/{n})")
    print(f"  answered the first listed queue       {first_rate:.2f}  ({first!r})")
    print(f"  always-first floor (labels = {first!r})  {floor:.2f}")
    print(f"  accuracy above the floor              {accuracy - floor:+.2f}  (offered only at +0.30 or more)")
    print(f"  answers                               {dict(sorted(answers.items()))}")
    print(f"  outcomes                              {dict(sorted(outcomes.items()))}")
    for detail in sorted({r["detail"] for r in rows if r["detail"]}):
        print(f"  detail                                {detail}")
    print(
        f"  seconds per call p50 / max            {percentile(seconds, 0.5):.2f} / {max(seconds):.2f}"
        f"  (one at a time, {sum(seconds):.1f} s in all)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base-url", required=True, help="the OpenAI-compatible API base, e.g. http://127.0.0.1:8080/v1"
    )
    parser.add_argument("--model", required=True, help="the model name the server expects")
    parser.add_argument("--api-key", default=os.environ.get("SWITCHBOARD_BENCH_API_KEY"), help="bearer key, if any")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call (the operator ceiling's default)")
    args = parser.parse_args()
    provider = Provider(
        name="bench", base_url=args.base_url.rstrip("/"), api_key=args.api_key, timeout_seconds=args.timeout, models=()
    )
    out = asyncio.run(run(provider, args.model, args.timeout))
    report(out["rows"], args.model, args.base_url)


if __name__ == "__main__":
    main()
