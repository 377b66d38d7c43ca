"""Human-readable todo titles derived from a delivery; display only, never used for routing."""

from __future__ import annotations

from typing import Any

from routing.text import MAX_TITLE_CHARS, cap_text


def todo_title(source: str, kind: str | None, payload: Any) -> str:
    """A one-line title such as ``github issues opened: owner/repo#12 Fix the build``; cleaned and capped."""
    return cap_text(_title(source, kind, payload), MAX_TITLE_CHARS)


def _title(source: str, kind: str | None, payload: Any) -> str:
    head = f"{source} {kind}" if kind else source
    if not isinstance(payload, dict):
        return head
    action = payload.get("action")
    if isinstance(action, str):
        head = f"{head} {action}"
    repo = payload.get("repository")
    repo_name = repo.get("full_name") if isinstance(repo, dict) else None
    for key in ("issue", "pull_request"):
        item = payload.get(key)
        if isinstance(item, dict):
            number, title = item.get("number"), item.get("title")
            where = f"{repo_name}#{number}" if repo_name else f"#{number}"
            return f"{head}: {where} {title if isinstance(title, str) else ''}".strip()
    for key in ("title", "subject", "summary", "type"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return f"{head}: {value}"
    if repo_name:
        return f"{head}: {repo_name}"
    return head
