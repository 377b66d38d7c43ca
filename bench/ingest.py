"""Ingest throughput and latency through the whole stack vs the bare-Temporal floor, in one run.

The stack: signed GitHub deliveries over HTTP → API (token lookup, HMAC) → RouteDelivery (load grant,
commit: two local activities) → 202 with the todo. The floor: a workflow with the same two no-op local
activities (bench/_floor_worker.py), started eagerly and awaited from a client whose worker runs in the same
process (this one), on the same dev server. So both paths cost Temporal the same three RPCs per delivery (start
with eager workflow task, one workflow task completion, one result poll) and one workflow task; what the floor
leaves out is HTTP, verification, PostgreSQL (webhook lookup, grant, commit) and the bigger payloads.

A second baseline, the featured floor, is the same workflow with what RouteDelivery asks of Temporal besides its
activities (summary, details and fairness key at start; activity summaries; the upsert of the sender's and the
decision's search attributes at the end; current details): the gap between the two floors is Temporal's own cost of
those features here, and switchboard / featured floor is what Switchboard adds besides them. Rounds alternate
the three paths.

    python bench/ingest.py [--deliveries 400] [--concurrency 8] [--client raw|httpx] [--profile dev.txt]
    python bench/ingest.py --rss 10000

It also prints CPU milliseconds per delivery by process for every path (the floor's client and worker are this
process; switchboard's are the `switchboard dev` process, which hosts the API and the worker; the Temporal dev
server; PostgreSQL), which is steadier than throughput on a shared machine. --rss drives that many deliveries
through switchboard alone and prints the resident memory of the process and its children at the start (after
the warm-up) and every tenth of the way, then start, end, peak and the growth over the second half.

The producers' HTTP client is bench/_stack.Wire by default (raw keep-alive HTTP/1.1): producers run elsewhere,
and httpx would spend about 2.5 ms of this machine's CPU per delivery, next to the stack it measures.
`--client httpx` measures with httpx instead. `--profile FILE` records `switchboard dev` (API and worker) with
py-spy during the measured rounds, sampling only the thread holding the GIL (the top functions by own Python
CPU go to FILE); py-spy's sampling costs CPU, so take the figures from a run without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import (
    children,
    cpu_seconds,
    dev_stack,
    drive,
    percentile,
    post_signed_issue,
    process_name,
    profiled,
    rss_mib,
    wires_or_httpx,
)
from tests.signing import sign_github

PATHS = ("floor", "featured", "switchboard")
FEATURED_DETAILS = "\n\n".join(
    [
        "**webhook** `wh_0123456789abcdef` · endpoint `ep_0123456789abcdef`",
        "**delivery** `wh_0123456789abcdef:0123456789abcdef0123456789abcdef`",
        "**trust** verified · verified yes (github hmac sha256)",
        "**body** about 2200 bytes, application/json",
        "**received** 2026-12-01T00:00:00+00:00",
    ]
)
"""RouteDelivery's start details have this shape (workflows/explain.start_details)."""


def row(name: str, elapsed: float, lat: list[float]) -> tuple[str, float, float, float]:
    return name, len(lat) / elapsed, percentile(lat, 0.5), percentile(lat, 0.99)


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out = [pid]
    for child in children(pid):
        out.extend(tree(child))
    return out


def stack_pids(dev_pid: int, home: str) -> list[int]:
    """The stack's processes: the dev process's tree, and PostgreSQL's (started detached, under ``home``)."""
    pids = set(tree(dev_pid))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if home.encode() in (entry / "cmdline").read_bytes():
                    pids.update(tree(int(entry.name)))
            except OSError:
                continue
    return sorted(pids)


def cpu_by_process(pids: list[int]) -> dict[str, float]:
    """CPU seconds used so far, by process name (processes of one name summed)."""
    used: dict[str, float] = {}
    for pid in pids:
        name = process_name(pid)
        name = "postgres" if "postgres" in name else name
        used[name] = used.get(name, 0.0) + cpu_seconds(pid)
    return used


async def run_all(
    stack_base: str, credential: str, address: str, args: argparse.Namespace, dev_pid: int = 0, home: str = ""
) -> dict[str, list[float]]:
    """Alternate the paths' rounds so drift in the shared server (SQLite growth, checkpoints) hits all alike."""
    from temporalio.client import Client
    from temporalio.common import Priority
    from temporalio.worker import Worker

    from bench._floor_worker import FeaturedFloor, Floor, noop_a, noop_b

    results: dict[str, list[float]] = {path: [] for path in PATHS}
    elapsed = dict.fromkeys(PATHS, 0.0)
    task_queue = f"floor-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(address)
    payload = "x" * 2000
    async with (
        Worker(
            client,
            task_queue=task_queue,
            workflows=[Floor, FeaturedFloor],
            activities=[noop_a, noop_b],
            max_concurrent_local_activities=50,
        ),
        httpx.AsyncClient(timeout=60) as http,
        wires_or_httpx(stack_base, args.client, args.concurrency) as producer,
    ):

        async def floor_one(i: int) -> None:
            await client.execute_workflow(
                Floor.run,
                payload,
                id=f"floor-{task_queue}-{uuid.uuid4().hex}",
                task_queue=task_queue,
                execution_timeout=timedelta(seconds=60),
                request_eager_start=True,
            )

        async def featured_one(i: int) -> None:
            # RouteDelivery's start: summary, details and fairness key, no search attributes (runtime/starts.py).
            await client.execute_workflow(
                FeaturedFloor.run,
                payload,
                id=f"featured-{task_queue}-{uuid.uuid4().hex}",
                task_queue=task_queue,
                execution_timeout=timedelta(seconds=60),
                request_eager_start=True,
                static_summary=f"github issues opened acme/app#{i}",
                static_details=FEATURED_DETAILS,
                priority=Priority(fairness_key="ep_0123456789abcdef"),
            )

        webhook = (
            await http.post(
                f"{stack_base}/v1/create_webhook",
                json={"source_type": "github", "target_queue": "work"},
                headers={"Authorization": f"Bearer {credential}"},
            )
        ).json()
        url = webhook["ingest_url"].replace("localhost", "127.0.0.1")
        secret = webhook["secret"].encode()

        async def ours_one(i: int) -> None:
            body = json.dumps(
                {
                    "action": "opened",
                    "issue": {"number": i, "title": f"issue {i}", "body": "x" * 2000},
                    "repository": {"full_name": "acme/app"},
                    "sender": {"login": "joe"},
                }
            ).encode()
            await post_signed_issue(producer, url, secret, body)

        if args.rss:

            async def accepted_one(i: int) -> None:
                # Memory, not latency: on a loaded machine a delivery may answer `202 pending`; it still runs.
                body = json.dumps({"action": "opened", "issue": {"number": i, "body": "x" * 2000}}).encode()
                headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": uuid.uuid4().hex}
                headers.update(sign_github(secret, body))
                resp = await http.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
                assert resp.status_code == 202, resp.text

            await drive(args.warmup, args.concurrency, accepted_one)
            await rss_run(args, dev_pid, accepted_one)
            return results
        paths = {"floor": floor_one, "featured": featured_one, "switchboard": ours_one}
        for fn in paths.values():
            await drive(args.warmup, args.concurrency, fn)
        cpu: dict[str, dict[str, float]] = {path: {} for path in PATHS}
        with profiled(dev_pid, args.profile, gil=True):
            await rounds(args, dev_pid, home, paths, results, elapsed, cpu)
    results["_elapsed"] = [elapsed[path] for path in PATHS]
    results["_cpu"] = [elapsed["switchboard"]]
    for proc, seconds in sorted(cpu["switchboard"].items(), key=lambda kv: -kv[1]):
        results[f"_cpu:{proc}"] = [seconds] + [cpu[path].get(proc, 0.0) for path in PATHS[:2]]
    return results


async def rounds(
    args: argparse.Namespace,
    dev_pid: int,
    home: str,
    paths: dict[str, Any],
    results: dict[str, list[float]],
    elapsed: dict[str, float],
    cpu: dict[str, dict[str, float]],
) -> None:
    """The measured rounds, the paths alternating, each with the CPU its processes used."""
    per_round = max(1, args.deliveries // args.rounds)
    for _ in range(args.rounds):
        for name, fn in paths.items():
            pids = [*stack_pids(dev_pid, home), os.getpid()] if dev_pid else []
            before = cpu_by_process(pids)
            took, lat = await drive(per_round, args.concurrency, fn)
            for proc, seconds in cpu_by_process(pids).items():
                cpu[name][proc] = cpu[name].get(proc, 0.0) + seconds - before.get(proc, 0.0)
            elapsed[name] += took
            results[name].extend(lat)


async def rss_run(args: argparse.Namespace, dev_pid: int, one: Any) -> None:
    """Drive args.rss deliveries and print the resident memory of the stack's processes as it goes."""

    series: dict[str, list[float]] = {}

    def snapshot(label: str) -> None:
        parts = []
        for i, p in enumerate(p for p in tree(dev_pid) if "temporal" not in process_name(p)):
            # The dev process first, then its children in tree order (sandbox children are numbered).
            key = "switchboard dev (API + worker)" if i == 0 else f"{process_name(p)[:30]} #{i}"
            series.setdefault(key, []).append(rss_mib(p))
            parts.append(f"{process_name(p)[:40]} {rss_mib(p):.1f}")
        print(f"  {label:>14}: " + " | ".join(parts) + " (MiB)", flush=True)

    print(
        f"\nRSS over {args.rss} deliveries (concurrency {args.concurrency}); switchboard dev = API + worker:",
        flush=True,
    )
    snapshot("start")
    step = max(1, args.rss // 10)
    done = 0
    while done < args.rss:
        n = min(step, args.rss - done)
        took, lat = await drive(n, args.concurrency, one)
        done += n
        snapshot(f"after {done}")
        print(f"  {'':>14}  ({n / took:.1f} deliveries/s, p50 {percentile(lat, 0.5):.1f} ms)", flush=True)
    # Flat means: whatever fills up early (caches, pools, the allocator's arenas) has stopped growing by the
    # half-way point, so the second half adds ~0.
    half = len(series.get("switchboard dev (API + worker)", [])) // 2
    print(f"\nRSS summary over {args.rss} deliveries (MiB; second half = end - after {done // 2}):")
    print(f"  {'process':<36} {'start':>8} {'end':>8} {'peak':>8} {'2nd half':>9}")
    for key, values in series.items():
        if len(values) < 3:
            continue  # a child that came or went during the run
        print(
            f"  {key:<36} {values[0]:>8.1f} {values[-1]:>8.1f} {max(values):>8.1f} {values[-1] - values[half]:>+9.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=600, help="per path, split over the rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rss", type=int, default=0, help="drive this many deliveries and print RSS instead")
    parser.add_argument(
        "--client", choices=("raw", "httpx"), default="raw", help="the producers' HTTP client (bench/_stack.Wire)"
    )
    parser.add_argument(
        "--profile", default=None, help="py-spy `switchboard dev` during the measured rounds; top functions here"
    )
    args = parser.parse_args()
    with dev_stack() as stack:
        endpoint = stack.vend(["work"], ["create_webhook", "claim_next"])
        res = asyncio.run(
            run_all(stack.base, str(endpoint["credential"]), stack.temporal_address, args, stack.pid, str(stack.home))
        )
    if args.rss:
        return
    floor = row("floor (bare workflow, 2 no-op local activities)", res["_elapsed"][0], res["floor"])
    featured = row("featured floor (+ RouteDelivery's Temporal features)", res["_elapsed"][1], res["featured"])
    ours = row("switchboard ingest (HTTP → RouteDelivery → 202)", res["_elapsed"][2], res["switchboard"])
    print(
        f"\ningest benchmark: {len(res['floor'])} deliveries per path in {args.rounds} alternating rounds, "
        f"concurrency {args.concurrency}, dev server (SQLite file), eager start in both, producers' client "
        f"{args.client}\n"
    )
    print(f"{'path':<52} {'deliveries/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for name, rate, p50, p99 in (floor, featured, ours):
        print(f"{name:<52} {rate:>12.1f} {p50:>8.1f} {p99:>8.1f}")
    print(f"\nthroughput ratio (switchboard / floor): {ours[1] / floor[1]:.2f}   (target >= 0.90)")
    print(f"p50 difference: {ours[2] - floor[2]:+.1f} ms   (target <= +10 ms)")
    print(
        f"featured floor / floor: {featured[1] / floor[1]:.2f} throughput, {featured[2] - floor[2]:+.1f} ms p50 "
        "(Temporal's own cost of the upsert, UI metadata, fairness key)"
    )
    print(
        f"switchboard / featured floor: {ours[1] / featured[1]:.2f} throughput, {ours[2] - featured[2]:+.1f} ms p50 "
        "(what switchboard adds besides those: HTTP, verification, PostgreSQL, payloads)"
    )
    wall = res["_cpu"][0]
    print(f"\nCPU during the switchboard rounds ({wall:.1f} s wall; 1.00 = one core busy all along):")
    for key, (seconds, *_) in ((k, v) for k, v in res.items() if k.startswith("_cpu:")):
        print(f"  {key[5:][:60]:<60} {seconds / wall:5.2f}")
    n_floor, n_featured, n_ours = len(res["floor"]), len(res["featured"]), len(res["switchboard"])
    me = process_name(os.getpid())
    print("\nCPU ms per delivery by process (same rounds; the floor's client and worker are this process,")
    print("switchboard's API and worker are `switchboard dev`, this process is then only its HTTP client):")
    print(f"  {'process':<52} {'floor':>8} {'featured':>9} {'switchboard':>12}")
    totals = [0.0, 0.0, 0.0]
    for key, (ours_s, floor_s, featured_s) in ((k, v) for k, v in res.items() if k.startswith("_cpu:")):
        name = key[5:]
        label = f"{name[:40]} (bench)" if name == me else name[:52]
        per = [1000 * floor_s / n_floor, 1000 * featured_s / n_featured, 1000 * ours_s / n_ours]
        totals = [t + x for t, x in zip(totals, per, strict=True)]
        print(f"  {label:<52} {per[0]:>8.2f} {per[1]:>9.2f} {per[2]:>12.2f}")
    print(f"  {'all processes':<52} {totals[0]:>8.2f} {totals[1]:>9.2f} {totals[2]:>12.2f}")


if __name__ == "__main__":
    main()
