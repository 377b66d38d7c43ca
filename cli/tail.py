"""`switchboard tail`: follow new events on the owner's webhooks and new todos (and their state changes) live.

It polls the two keyset-paged listings, `list_webhook_events` and `list_todos`, rather than the SSE doorbell
(`GET /v1/stream`): the doorbell announces only new todos, of the calling endpoint, and a ring is a hint that may
be dropped under load, while events have no stream at all. The listings are the record: newest first, so one
page per poll holds everything new unless more than a page arrived since the last poll, and then the poll
follows the cursor until it reaches rows it has shown. What existed when tail started is not printed.

An event whose commit lands after younger ones (deliveries commit concurrently) still appears: each poll reads
back over a window before the newest event seen, and ids already shown are remembered.
"""

from __future__ import annotations

import json
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from cli.output import Mode, cell

Call = Callable[[str, dict[str, Any]], Any]
"""POST one agent verb as the owner and answer its JSON (raises cli.client.CliError)."""

PAGE = 100
MAX_PAGES = 10
"""Pages one poll follows at most before it shows what it has (a burst larger than this is cut, and said so)."""
LATE_COMMIT = timedelta(minutes=2)
"""How far before the newest event seen each poll reads again, for deliveries that commit late."""
READY = "tail: following new events and todos (Ctrl-C stops)"
REMEMBERED = 20_000
"""Ids remembered to print each row once; the oldest are forgotten first."""


class Seen:
    """Ids already shown (with a todo's last state), bounded."""

    def __init__(self) -> None:
        self.items: OrderedDict[str, str] = OrderedDict()

    def update(self, key: str, state: str) -> str | None:
        """Record a row; answer its previous state, or None when it is new."""
        before = self.items.get(key)
        self.items[key] = state
        self.items.move_to_end(key)
        while len(self.items) > REMEMBERED:
            self.items.popitem(last=False)
        return before


def _pages(
    call: Call, verb: str, body: dict[str, Any], rows_key: str, seen: Seen, pages: int
) -> tuple[list[dict[str, Any]], bool]:
    """Newest-first rows until a page holds one already seen (or the listing ends); and whether it was cut."""
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(pages):
        answer = call(verb, {**body, "limit": PAGE, **({"cursor": cursor} if cursor else {})})
        page: list[dict[str, Any]] = answer[rows_key]
        rows += page
        cursor = answer.get("next_cursor")
        if cursor is None or any(r["id"] in seen.items for r in page):
            return rows, False
    return rows, True


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _line(kind: str, row: dict[str, Any], how: Mode, before: str | None = None) -> str:
    if how == "json":
        return json.dumps({"type": kind, **({"previous_state": before} if before else {}), **row}, ensure_ascii=False)
    if kind == "event":
        todos = ",".join(row.get("todo_ids") or []) or "-"
        return (
            f"{cell(row['received_at'])}  event {row['id']}  {row['source']} {cell(row.get('kind'))}"
            f"  {row['disposition']}  {row['webhook_id']}  todos {todos}"
        )
    change = f"{before} → {row['state']}" if before else row["state"]
    return f"{cell(row['created_at'])}  todo  {row['id']}  {row['queue']}  {change}  {cell(row['title'])}"


class Tail:
    """The follow loop's state: what was shown, and how far back the next poll reads."""

    def __init__(self, call: Call, how: Mode, *, webhook_id: str | None, queue: str | None) -> None:
        self.call = call
        self.how = how
        self.events_filter = {"webhook_id": webhook_id} if webhook_id else {}
        self.todos_filter = {"queue": queue} if queue else {}
        self.events = Seen()
        self.todos = Seen()
        self.newest_event: datetime | None = None

    def _print(self, text: str) -> None:
        print(text, flush=True)

    def poll(self, *, show: bool) -> None:
        """One round over both listings; rows not shown before are printed (when `show`), oldest first."""
        since = {"since": (self.newest_event - LATE_COMMIT).isoformat()} if self.newest_event else {}
        # The first round only learns where "now" is: one page of each, none of it printed.
        pages = MAX_PAGES if show else 1
        events, cut = _pages(
            self.call, "list_webhook_events", {**self.events_filter, **since}, "events", self.events, pages
        )
        if cut and show:
            print("tail: more events arrived than one poll reads; some were skipped", file=sys.stderr, flush=True)
        for row in reversed(events):
            at = _instant(row["received_at"])
            self.newest_event = at if self.newest_event is None else max(self.newest_event, at)
            if self.events.update(row["id"], row["disposition"]) is None and show:
                self._print(_line("event", row, self.how))
        todos, cut = _pages(self.call, "list_todos", self.todos_filter, "todos", self.todos, pages)
        if cut and show:
            print("tail: more todos arrived than one poll reads; some were skipped", file=sys.stderr, flush=True)
        for row in reversed(todos):
            before = self.todos.update(row["id"], row["state"])
            if show and (before is None or before != row["state"]):
                self._print(_line("todo", row, self.how, before))

    def run(self, interval: float, *, until: float | None = None) -> None:
        """Poll forever (or until the monotonic deadline `until`), `interval` seconds apart."""
        self.poll(show=False)
        # On standard error in both modes: a script reading the JSON lines can wait for it before it acts.
        print(READY, file=sys.stderr, flush=True)
        while until is None or time.monotonic() < until:
            time.sleep(interval)
            self.poll(show=True)
