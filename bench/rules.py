"""Rule evaluation cost: the jq sandbox (warm child pool) against in-process libjq.

Run: ``python bench/rules.py``. Prints figures only; the targets in the table are for reading, not asserted.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from routing.sandbox import SandboxPool, evaluate_in_process

ITERATIONS = 500
RUNAWAY_ITERATIONS = 20


def _user(login: str, uid: int) -> dict[str, Any]:
    base = f"https://api.github.com/users/{login}"
    return {
        "login": login,
        "id": uid,
        "node_id": f"MDQ6VXNlcj{uid}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{uid}?v=4",
        "gravatar_id": "",
        "url": base,
        "html_url": f"https://github.com/{login}",
        "followers_url": f"{base}/followers",
        "following_url": f"{base}/following{{/other_user}}",
        "gists_url": f"{base}/gists{{/gist_id}}",
        "starred_url": f"{base}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{base}/subscriptions",
        "organizations_url": f"{base}/orgs",
        "repos_url": f"{base}/repos",
        "events_url": f"{base}/events{{/privacy}}",
        "received_events_url": f"{base}/received_events",
        "type": "User",
        "site_admin": False,
    }


def _repository() -> dict[str, Any]:
    api = "https://api.github.com/repos/acme/widgets"
    repo: dict[str, Any] = {
        "id": 123456789,
        "node_id": "R_kgDOB1234",
        "name": "widgets",
        "full_name": "acme/widgets",
        "private": False,
        "owner": _user("acme", 1001),
        "html_url": "https://github.com/acme/widgets",
        "description": "Widgets, sprockets and the occasional gizmo.",
        "fork": False,
        "url": api,
        "created_at": "2021-03-04T05:06:07Z",
        "updated_at": "2026-11-28T10:11:12Z",
        "pushed_at": "2026-11-28T09:00:00Z",
        "homepage": "https://widgets.example",
        "size": 48213,
        "stargazers_count": 1312,
        "watchers_count": 1312,
        "language": "Python",
        "has_issues": True,
        "has_projects": True,
        "has_downloads": True,
        "has_wiki": False,
        "has_pages": False,
        "forks_count": 211,
        "archived": False,
        "disabled": False,
        "open_issues_count": 87,
        "license": {
            "key": "mit",
            "name": "MIT License",
            "spdx_id": "MIT",
            "url": "https://api.github.com/licenses/mit",
        },
        "topics": ["widgets", "sprockets", "automation", "python"],
        "visibility": "public",
        "forks": 211,
        "open_issues": 87,
        "watchers": 1312,
        "default_branch": "main",
    }
    for name in (
        "forks",
        "keys",
        "collaborators",
        "teams",
        "hooks",
        "issue_events",
        "events",
        "assignees",
        "branches",
        "tags",
        "blobs",
        "git_tags",
        "git_refs",
        "trees",
        "statuses",
        "languages",
        "stargazers",
        "contributors",
        "subscribers",
        "subscription",
        "commits",
        "git_commits",
        "comments",
        "issue_comment",
        "contents",
        "compare",
        "merges",
        "archive",
        "downloads",
        "issues",
        "pulls",
        "milestones",
        "notifications",
        "labels",
        "releases",
        "deployments",
    ):
        repo[f"{name}_url"] = f"{api}/{name}"
    return repo


def github_issue_envelope() -> dict[str, Any]:
    """A realistic GitHub ``issues``/``opened`` delivery as the router's envelope (about 25 KB)."""
    label_names = ["bug", "needs-triage", "area/api", "priority/p2", "good first issue"]
    labels = [
        {
            "id": 5000 + i,
            "node_id": f"LA_kwDO{i}",
            "url": f"https://api.github.com/repos/acme/widgets/labels/{name.replace(' ', '%20')}",
            "name": name,
            "color": "d73a4a",
            "default": i == 0,
            "description": f"Issues labelled {name}",
        }
        for i, name in enumerate(label_names)
    ]
    paragraph = (
        "When a sprocket is registered twice within the same second the widget service returns a 500 "
        "instead of a 409. The traceback points at the uniqueness check in the registry, which runs "
        "before the transaction is committed. Steps, logs and the full environment are below. "
    )
    body = "### Summary\n\n" + "\n\n".join(paragraph * 3 for _ in range(18)) + "\n\n```\nTraceback ...\n```\n"
    author = _user("octo-reporter", 424242)
    issue = {
        "url": "https://api.github.com/repos/acme/widgets/issues/4711",
        "repository_url": "https://api.github.com/repos/acme/widgets",
        "labels_url": "https://api.github.com/repos/acme/widgets/issues/4711/labels{/name}",
        "comments_url": "https://api.github.com/repos/acme/widgets/issues/4711/comments",
        "events_url": "https://api.github.com/repos/acme/widgets/issues/4711/events",
        "html_url": "https://github.com/acme/widgets/issues/4711",
        "id": 9_007_199_254_740_993,  # beyond 2^53 on purpose
        "node_id": "I_kwDOB1234c5abcd",
        "number": 4711,
        "title": "Registering the same sprocket twice returns 500 instead of 409",
        "user": author,
        "labels": labels,
        "state": "open",
        "locked": False,
        "assignee": _user("maintainer-one", 77),
        "assignees": [_user("maintainer-one", 77), _user("maintainer-two", 78)],
        "milestone": None,
        "comments": 3,
        "created_at": "2026-11-28T10:00:00Z",
        "updated_at": "2026-11-28T10:11:12Z",
        "closed_at": None,
        "author_association": "CONTRIBUTOR",
        "active_lock_reason": None,
        "body": body,
        "reactions": {
            "url": "https://api.github.com/repos/acme/widgets/issues/4711/reactions",
            "total_count": 4,
            "+1": 3,
            "-1": 0,
            "laugh": 0,
            "hooray": 0,
            "confused": 0,
            "heart": 1,
            "rocket": 0,
            "eyes": 0,
        },
        "timeline_url": "https://api.github.com/repos/acme/widgets/issues/4711/timeline",
        "state_reason": None,
    }
    payload = {
        "action": "opened",
        "issue": issue,
        "repository": _repository(),
        "organization": {"login": "acme", "id": 1001, "url": "https://api.github.com/orgs/acme"},
        "sender": author,
    }
    size = len(json.dumps(payload))
    return {
        "source": "github",
        "kind": "issues.opened",
        "webhook_id": "wh_01JDBENCH0000000000000000",
        "trust_mode": "signed",
        "verified": True,
        "content_type": "application/json",
        "size": size,
        "headers": {
            "x-github-event": "issues",
            "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            "x-github-hook-id": "292430182",
            "user-agent": "GitHub-Hookshot/044aadd",
        },
        "payload": payload,
        "artifact": None,
        "issue": {
            "provider": "github",
            "action": "opened",
            "event_type": "issues",
            "repo": "acme/widgets",
            "number": 4711,
            "title": issue["title"],
            "url": issue["html_url"],
            "state": "open",
            "author": "octo-reporter",
            "sender": "octo-reporter",
            "labels": label_names,
            "label": None,
            "body_size": len(body.encode()),
            "label_event": False,
            "key": "github:acme/widgets#4711",
        },
    }


PARAMS = {
    "trusted_humans": ["alice", "bob", "carol"],
    "security_repos": ["acme/vault", "acme/keys"],
    "triage_queue_labels": ["needs-triage"],
}

# 31 realistic rules that miss this event, then one that matches: every delivery walks the whole list.
NON_MATCHING = [
    '.issue.action == "closed"',
    '.issue.label_event and .issue.label == "ready"',
    ".issue.repo as $r | ($params.security_repos | arrays | index($r)) != null",
    ".issue.author as $a | ($params.trusted_humans | arrays | index($a)) != null",
    '.issue.labels | index("security") != null',
    '.issue.labels | any(startswith("priority/p0"))',
    '.issue.title | test("^\\\\[RFC\\\\]"; "i")',
    '.payload.issue.body | contains("SECURITY.md")',
    '.issue.state == "closed" and .issue.action == "reopened"',
    ".payload.repository.private",
    ".payload.repository.archived",
    '.payload.issue.author_association == "OWNER"',
    '.payload.issue.milestone.title == "v2.0"',
    ".issue.body_size > 100000",
    '.source == "gitea"',
    '.kind == "issues.deleted"',
    '.headers["x-github-event"] == "pull_request"',
    '.payload.issue.assignees | map(.login) | index("release-bot") != null',
    '.payload.issue.labels | map(.name) | index("wontfix") != null',
    ".issue.labels | length > 8",
    ".payload.issue.reactions.total_count > 50",
    ".payload.issue.comments > 100",
    '.issue.title | ascii_downcase | contains("flaky test")',
    '.payload.sender.type == "Bot"',
    ".payload.issue.user.site_admin",
    '.issue.labels | index("area/docs") != null and index("good first issue") != null',
    '.payload.repository.topics | index("security") != null',
    '.payload.issue.state_reason == "not_planned"',
    "(.payload.issue.body | length) < 10",
    '.issue.key | startswith("gitea:")',
    ".verified | not",
]
MATCHING = '.issue.action == "opened" and (.issue.labels | index("needs-triage") != null) and .verified'
RULES = [{"id": f"r{i:02d}", "expr": e, "action": {"queue": "triage"}} for i, e in enumerate([*NON_MATCHING, MATCHING])]
RUNAWAY_RULES = [
    {"id": "runaway", "expr": "def f: f; f", "action": {"queue": "never"}},
    {"id": "decides", "expr": MATCHING, "action": {"queue": "triage"}},
]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


async def main() -> None:
    envelope = github_issue_envelope()
    assert len(RULES) == 32
    expected = evaluate_in_process(RULES, PARAMS, envelope)
    assert expected.matched_index == 31 and not expected.faults, expected

    pool = SandboxPool()
    try:
        for _ in range(20):  # warm: children started, programs compiled in each
            assert (await pool.evaluate(RULES, PARAMS, envelope)) == expected
            evaluate_in_process(RULES, PARAMS, envelope)
        await asyncio.sleep(0.5)  # let the spare finish starting
        # Interleaved, so both see the same machine (other work shares these cores).
        in_process: list[float] = []
        sandboxed: list[float] = []
        for _ in range(ITERATIONS):
            t0 = time.perf_counter()
            evaluate_in_process(RULES, PARAMS, envelope)
            t1 = time.perf_counter()
            result = await pool.evaluate(RULES, PARAMS, envelope)
            t2 = time.perf_counter()
            assert result == expected, result
            in_process.append(t1 - t0)
            sandboxed.append(t2 - t1)

        # Steady state for a webhook whose rule 0 runs away: every delivery kills a child, which is
        # replaced after the delivery and pre-compiles the webhook's recent rule lists.
        for _ in range(3):
            await pool.evaluate(RUNAWAY_RULES, PARAMS, envelope)
            await asyncio.sleep(0.3)
        runaway: list[float] = []
        for _ in range(RUNAWAY_ITERATIONS):
            await asyncio.sleep(0.3)  # the replacement child starts between deliveries
            t0 = time.perf_counter()
            result = await pool.evaluate(RUNAWAY_RULES, PARAMS, envelope)
            runaway.append(time.perf_counter() - t0)
            assert result.matched_index == 1, result
            assert [f.cause for f in result.faults] == ["timeout"], result
    finally:
        await pool.close()

    size = len(json.dumps(envelope))
    print(f"envelope {size / 1024:.1f} KiB, {len(RULES)} rules, match at the last; {ITERATIONS} deliveries each")
    print(f"{'evaluation':<34}{'p50 ms':>9}{'p99 ms':>9}")
    print(f"{'in-process libjq (cached)':<34}{_pct(in_process, 0.5):>9.3f}{_pct(in_process, 0.99):>9.3f}")
    print(f"{'sandboxed (warm pool)':<34}{_pct(sandboxed, 0.5):>9.3f}{_pct(sandboxed, 0.99):>9.3f}")
    ratio50 = _pct(sandboxed, 0.5) / _pct(in_process, 0.5)
    ratio99 = _pct(sandboxed, 0.99) / _pct(in_process, 0.99)
    print(f"{'ratio sandboxed / in-process':<34}{ratio50:>8.2f}x{ratio99:>8.2f}x   (target <= 1.5x)")
    print(
        f"one runaway rule (rule 0 loops, rule 1 decides): p50 {_pct(runaway, 0.5):.1f} ms, "
        f"max {max(runaway) * 1000:.1f} ms over {RUNAWAY_ITERATIONS}   (target <= 60 ms); rule 1 decided every time"
    )


if __name__ == "__main__":
    asyncio.run(main())
