"""End-to-end ingest throughput with 32 routing rules (the last one matches) vs no rules, same stack, same run.

Both paths are signed GitHub issues deliveries of a realistic ~25 KB payload over HTTP → API → RouteDelivery
→ 202 with the todo. The only difference is the webhook: one has no rules (no evaluate activity, no sandbox
child), the other has 32 rules evaluated in the sandbox, first-match-wins, matching on the last. Rounds
alternate so drift in the shared dev server hits both alike.

    python bench/ingest_rules.py [--deliveries 600] [--rounds 4] [--concurrency 8] [--client raw|httpx]
    python bench/ingest_rules.py --flood [--deliveries 40]

The run prints how many evaluations took each path (a free sandbox child of the worker, or the fair evaluate queue:
switchboard_evaluations_total of the dev process).

--flood measures fairness instead: endpoint B's p50 with one sender (32 realistic rules, match on the last)
alone, then while endpoint A floods its own webhook with 32 slow rules from 16 senders; it also counts B's
deliveries that did not follow B's rule (target 0).
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

from bench._stack import dev_stack, drive, percentile, post_signed_issue, wires_or_httpx
from bench.ingest import cpu_by_process, stack_pids
from tests.signing import sign_github


def issue_body(i: int) -> bytes:
    """A GitHub issues/opened delivery of about 25 KB, shaped like the real thing."""
    user = {
        "login": "joestump",
        "id": 1234,
        "node_id": "MDQ6VXNlcjEyMzQ=",
        "avatar_url": "https://avatars.githubusercontent.com/u/1234?v=4",
        "html_url": "https://github.com/joestump",
        "type": "User",
        "site_admin": False,
    }
    labels = [
        {"id": 100 + n, "name": name, "color": "ededed", "default": False} for n, name in enumerate(["bug", "size/M"])
    ]
    payload: dict[str, Any] = {
        "action": "opened",
        "issue": {
            "url": f"https://api.github.com/repos/acme/app/issues/{i}",
            "html_url": f"https://github.com/acme/app/issues/{i}",
            "id": 900000 + i,
            "number": i,
            "title": f"Build fails on main after dependency bump #{i}",
            "user": user,
            "labels": labels,
            "state": "open",
            "locked": False,
            "assignees": [user],
            "comments": 3,
            "created_at": "2026-09-01T12:00:00Z",
            "updated_at": "2026-09-01T12:00:00Z",
            "author_association": "OWNER",
            "body": ("Steps to reproduce: run make test on a clean checkout and watch the build fail. " * 250)[:20000],
            "reactions": {"total_count": 0, "+1": 0, "-1": 0},
        },
        "repository": {
            "id": 42,
            "name": "app",
            "full_name": "acme/app",
            "private": False,
            "owner": user,
            "html_url": "https://github.com/acme/app",
            "description": "The app",
            "topics": ["python", "webhooks", "agents"],
            "default_branch": "main",
        },
        "sender": user,
    }
    for n in range(20):
        payload["repository"][f"{['issues', 'pulls', 'hooks', 'events', 'tags'][n % 5]}_url_{n}"] = (
            f"https://api.github.com/repos/acme/app/endpoint/{n}{{/number}}"
        )
    return json.dumps(payload).encode()


def rules_32() -> list[dict[str, Any]]:
    """31 realistic non-matching rules (labels, kinds, repos, authors, params) and a last one that matches."""
    rules: list[dict[str, Any]] = []
    for n in range(31):
        kind = n % 4
        if kind == 0:
            expr = f'.issue != null and (.issue.labels | index("area/component-{n}") != null)'
        elif kind == 1:
            expr = f'.kind == "pull_request" and .payload.pull_request.number == {n}'
        elif kind == 2:
            expr = f'.issue.repo == "acme/other-{n}"'
        else:
            expr = f".issue.author as $a | [$params.blocked | arrays | .[] | strings] | any(.[]; . == $a) and {n} >= 0"
        rules.append({"id": f"r{n}", "expr": expr, "action": {"drop": True}})
    rules.append({"id": "issues", "expr": ".issue != null and .verified", "action": {"queue": "work"}})
    return rules


def cpu_now(pids: list[int]) -> dict[str, float]:
    """CPU seconds so far by process kind: the dev process (API + worker), the sandbox children, Temporal,
    PostgreSQL, and this process (the senders)."""
    out: dict[str, float] = {"bench": time.process_time()}
    for name, used in cpu_by_process(pids).items():
        kind = "temporal" if "temporal" in name else "postgres" if "postgres" in name else name
        kind = "sandbox" if "sandbox" in kind or "routing" in kind else kind
        out[kind] = out.get(kind, 0.0) + used
    return out


async def evaluation_paths(http: httpx.AsyncClient, base: str) -> dict[str, float]:
    """switchboard_evaluations_total of the dev process (API and its hosted worker) by path."""
    text = (await http.get(f"{base}/metrics")).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("switchboard_evaluations_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = float(line.rsplit(" ", 1)[1])
    return out


def paths_line(before: dict[str, float], after: dict[str, float]) -> str:
    """``local 590, queue 10, local_forced 0`` between two scrapes."""
    names = sorted(set(before) | set(after) | {"local", "queue"})
    return ", ".join(f"{name} {after.get(name, 0.0) - before.get(name, 0.0):.0f}" for name in names)


async def run_all(base: str, credential: str, args: argparse.Namespace, pids: list[int]) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {credential}"}
    results: dict[str, list[float]] = {"none": [], "rules": []}
    paths: dict[str, float] = {}
    elapsed = {"none": 0.0, "rules": 0.0}
    cpu: dict[str, dict[str, float]] = {"none": {}, "rules": {}}
    counter = iter(range(10**9))
    async with (
        httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=args.concurrency * 2)) as http,
        wires_or_httpx(base, args.client, args.concurrency) as producer,
    ):

        async def webhook(rules: list[dict[str, Any]] | None) -> tuple[str, bytes, str]:
            made = (
                await http.post(
                    f"{base}/v1/create_webhook", json={"source_type": "github", "target_queue": "work"}, headers=auth
                )
            ).json()
            if rules is not None:
                resp = await http.post(
                    f"{base}/v1/set_webhook_rules",
                    json={"webhook_id": made["webhook_id"], "rules": rules, "params": {"blocked": ["mallory"]}},
                    headers=auth,
                )
                assert resp.status_code == 200, resp.text
            return made["ingest_url"].replace("localhost", "127.0.0.1"), made["secret"].encode(), made["webhook_id"]

        plain = await webhook(None)
        ruled = await webhook(rules_32())
        body_size = len(issue_body(1))

        def sender(target: tuple[str, bytes, str] | tuple[str, bytes]) -> Any:
            url, secret = target[0], target[1]

            async def one(_: int) -> None:
                body = issue_body(next(counter) + 1)
                await post_signed_issue(producer, url, secret, body)

            return one

        # The ruled webhook really decides on its last rule, with no faults on the way.
        ruled_id = ruled[2]
        tried = await http.post(
            f"{base}/v1/test_webhook_rules",
            json={
                "webhook_id": ruled_id,
                "payload": json.loads(issue_body(1)),
                "headers": {"X-GitHub-Event": "issues"},
            },
            headers=auth,
        )
        trace = tried.json()["trace"]
        assert trace.get("rule_index") == 31 and "faults" not in trace, tried.text
        senders = {"none": sender(plain), "rules": sender(ruled)}
        for fn in senders.values():
            await drive(args.warmup, args.concurrency, fn)
        per_round = max(1, args.deliveries // args.rounds)
        for _ in range(args.rounds):
            for name, fn in senders.items():
                scraped = await evaluation_paths(http, base) if name == "rules" else {}
                before = cpu_now(pids)
                took, lat = await drive(per_round, args.concurrency, fn)
                after = cpu_now(pids)
                if name == "rules":
                    for path, n in (await evaluation_paths(http, base)).items():
                        paths[path] = paths.get(path, 0.0) + n - scraped.get(path, 0.0)
                for kind, used in after.items():
                    cpu[name][kind] = cpu[name].get(kind, 0.0) + used - before.get(kind, 0.0)
                elapsed[name] += took
                results[name].extend(lat)
    return {"lat": results, "elapsed": elapsed, "body_size": body_size, "cpu": cpu, "paths": paths}


SLOW = "[range(40000)] | length < 0"  # about 30 ms of libjq work: every flooding delivery spends its budget


async def flood_figures(base: str, cred_a: str, cred_b: str, args: argparse.Namespace) -> dict[str, Any]:
    """B's latency and outcomes alone and under A's flood (16 senders, 32 slow rules)."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as http:

        async def traces(cred: str, webhook_id: str) -> list[dict[str, Any]]:
            """Every routing trace of one webhook, through list_webhook_events."""
            out: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = (
                    await http.post(
                        f"{base}/v1/list_webhook_events",
                        json={"webhook_id": webhook_id, "limit": 200, "cursor": cursor},
                        headers={"Authorization": f"Bearer {cred}"},
                    )
                ).json()
                out.extend(e["routing"] for e in page["events"])
                if not (cursor := page.get("next_cursor")):
                    return out

        async def webhook(cred: str, rules: list[dict[str, Any]]) -> tuple[str, bytes, str]:
            auth = {"Authorization": f"Bearer {cred}"}
            made = (
                await http.post(
                    f"{base}/v1/create_webhook", json={"source_type": "github", "target_queue": "work"}, headers=auth
                )
            ).json()
            resp = await http.post(
                f"{base}/v1/set_webhook_rules",
                json={"webhook_id": made["webhook_id"], "rules": rules, "params": {"blocked": ["mallory"]}},
                headers=auth,
            )
            assert resp.status_code == 200, resp.text
            url = made["ingest_url"].replace("localhost", "127.0.0.1")
            return url, made["secret"].encode(), made["webhook_id"]

        a_url, a_secret, a_id = await webhook(cred_a, [{"expr": SLOW, "action": {"drop": True}} for _ in range(32)])
        b_url, b_secret, b_id = await webhook(cred_b, rules_32())
        counter = iter(range(10**9))

        pending = {"n": 0}

        async def post(url: str, secret: bytes) -> dict[str, Any]:
            body = issue_body(next(counter) + 1)
            headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": uuid.uuid4().hex}
            headers.update(sign_github(secret, body))
            resp = await http.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
            assert resp.status_code == 202, resp.text
            answer: dict[str, Any] = resp.json()
            return answer

        async def b_one(_: int) -> None:
            # A delivery still routing after the ingest wait (10 s) answers pending; its latency is then 10 s.
            pending["n"] += bool((await post(b_url, b_secret)).get("pending"))

        await drive(5, 1, b_one)  # warm the children with B's list
        alone_paths = await evaluation_paths(http, base)
        _, alone = await drive(args.deliveries, 1, b_one)
        flood_paths = await evaluation_paths(http, base)
        stop = asyncio.Event()

        async def a_sender() -> None:
            # A's own deliveries may outwait the ingest wait and answer 202 pending: they queue, never fault.
            while not stop.is_set():
                await post(a_url, a_secret)

        senders = [asyncio.create_task(a_sender()) for _ in range(16)]
        await asyncio.sleep(2)  # let A's backlog build
        _, flooded = await drive(args.deliveries, 1, b_one)
        stop.set()
        await asyncio.gather(*senders)
        end_paths = await evaluation_paths(http, base)
        b_pending = pending["n"]
        # Pending deliveries are still routing: poll until all of them are events.
        while len(b_traces := await traces(cred_b, b_id)) < 2 * args.deliveries + 5:  # noqa: ASYNC110
            await asyncio.sleep(1)
        a_traces = await traces(cred_a, a_id)
        return {
            "alone": alone,
            "flooded": flooded,
            "b_total": len(b_traces),
            "b_pending": b_pending,
            "b_off_rule": sum(t.get("rule_id") != "issues" or bool(t.get("faults")) for t in b_traces),
            "a_total": len(a_traces),
            "busy": sum(f["cause"] == "sandbox_busy" for t in b_traces + a_traces for f in t.get("faults", [])),
            "alone_paths": paths_line(alone_paths, flood_paths),
            "flood_paths": paths_line(flood_paths, end_paths),
        }


def main_flood(args: argparse.Namespace) -> None:
    """Print B's p50/p99 alone and under A's flood, and how many of B's deliveries missed B's rule."""
    verbs = ["create_webhook", "set_webhook_rules", "list_webhook_events"]
    with dev_stack() as stack:
        cred_a = str(stack.vend(["work"], verbs)["credential"])
        cred_b = str(stack.vend(["work"], verbs)["credential"])
        res = asyncio.run(flood_figures(stack.base, cred_a, cred_b, args))
    print(f"\nfairness: endpoint B, one sender, {args.deliveries} deliveries per phase, 32 rules (match on the last)")
    print(f"{'phase':<44} {'p50 ms':>8} {'p99 ms':>8}")
    for name, label in (("alone", "B alone"), ("flooded", "B while A floods (16 senders, 32 slow rules)")):
        print(f"{label:<44} {percentile(res[name], 0.5):>8.1f} {percentile(res[name], 0.99):>8.1f}")
    print(f"A's flood: {res['a_total']} deliveries")
    print(f"evaluations by path, B alone: {res['alone_paths']}; during the flood (A and B): {res['flood_paths']}")
    print(f"B deliveries answered pending (still routing after the 10 s ingest wait): {res['b_pending']}")
    print(f"B deliveries not decided by B's matching rule: {res['b_off_rule']} of {res['b_total']}   (target 0)")
    print(f"sandbox_busy faults on any delivery of A or B: {res['busy']}   (target 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=600, help="per path, split over the rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument(
        "--client", choices=("raw", "httpx"), default="raw", help="the producers' HTTP client (bench/_stack.Wire)"
    )
    parser.add_argument("--flood", action="store_true", help="measure endpoint B's latency under endpoint A's flood")
    args = parser.parse_args()
    if args.flood:
        args.deliveries = min(args.deliveries, 40) if args.deliveries == 600 else args.deliveries
        main_flood(args)
        return
    with dev_stack() as stack:
        endpoint = stack.vend(["work"], ["create_webhook", "set_webhook_rules", "test_webhook_rules"])
        pids = stack_pids(stack.pid, str(stack.home))
        res = asyncio.run(run_all(stack.base, str(endpoint["credential"]), args, pids))
    rows = []
    for name, label in (
        ("none", "no rules (no evaluate activity)"),
        ("rules", "32 rules, match on the last (sandbox)"),
    ):
        lat = res["lat"][name]
        rows.append((label, len(lat) / res["elapsed"][name], percentile(lat, 0.5), percentile(lat, 0.99)))
    print(
        f"\ningest with rules: {len(res['lat']['none'])} deliveries per path in {args.rounds} alternating rounds, "
        f"concurrency {args.concurrency}, {res['body_size'] / 1024:.1f} KB GitHub issues payload, dev server\n"
    )
    print(f"{'path':<44} {'deliveries/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for label, rate, p50, p99 in rows:
        print(f"{label:<44} {rate:>12.1f} {p50:>8.1f} {p99:>8.1f}")
    print(f"\nthroughput ratio (32 rules / no rules): {rows[1][1] / rows[0][1]:.2f}   (target >= 0.85)")
    print(f"p50 difference: {rows[1][2] - rows[0][2]:+.1f} ms")
    print(f"evaluations of the 32-rule rounds by path: {paths_line({}, res['paths'])}")
    kinds = sorted({k for per in res["cpu"].values() for k in per}, key=lambda k: -res["cpu"]["rules"].get(k, 0.0))
    print("\nCPU ms per delivery by process (same rounds):")
    print(f"{'process':<44} {'no rules':>10} {'32 rules':>10} {'added':>10}")
    for kind in kinds:
        a, b = (1000 * res["cpu"][p].get(kind, 0.0) / max(1, len(res["lat"][p])) for p in ("none", "rules"))
        print(f"{kind[:44]:<44} {a:>10.2f} {b:>10.2f} {b - a:>+10.2f}")


if __name__ == "__main__":
    main()
