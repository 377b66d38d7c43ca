"""How a client command prints an answer: a readable table on a terminal, JSON otherwise or with `--json`.

The JSON is the verb's answer exactly as the API sent it, so scripts read the documented output models. The table
is for a person: the answer's list of rows (`todos`, `events`, …) as columns, long cells cut, instants to the
second; the answer's other fields follow as `key: value` lines, and a next page is named on standard error.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Literal, TextIO

Mode = Literal["json", "table"]

CELL_MAX = 60
"""A table cell longer than this is cut (the last column never is); `--json` shows everything."""
AUTO_COLUMNS_MAX = 8

_INSTANT = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def mode(asked: str | None, stream: TextIO | None = None) -> Mode:
    """`--json` / `--table` when given; else a table on a terminal and JSON into a pipe or file."""
    if asked == "json":
        return "json"
    if asked == "table":
        return "table"
    out = stream if stream is not None else sys.stdout
    return "table" if out.isatty() else "json"


def cell(value: Any) -> str:
    """One value as table text: instants to the second (UTC shown as written), lists comma-joined, objects as JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        found = _INSTANT.match(value)
        if found:
            zone = found.group(4)
            return f"{found.group(1)} {found.group(2)}" + ("" if zone in (None, "Z", "+00:00") else zone)
        return " ".join(value.split())  # one line per row, whatever the producer's title holds
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ",".join(cell(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _scalar(value: Any) -> bool:
    return not isinstance(value, dict | list) or (
        isinstance(value, list) and all(not isinstance(v, dict | list) for v in value)
    )


def table(rows: list[dict[str, Any]], columns: tuple[str, ...] = ()) -> list[str]:
    """Rows as aligned columns under an upper-case header; columns default to the first row's scalar fields."""
    if not columns:
        columns = tuple(k for k, v in rows[0].items() if _scalar(v))[:AUTO_COLUMNS_MAX] if rows else ()
    grid = [[c.upper() for c in columns]]
    for row in rows:
        texts = [cell(row.get(c)) for c in columns]
        grid.append([_cut(t, CELL_MAX) if i < len(columns) - 1 else t for i, t in enumerate(texts)])
    widths = [max(len(line[i]) for line in grid) for i in range(len(columns))]
    return ["  ".join(t.ljust(w) for t, w in zip(line, widths, strict=True)).rstrip() for line in grid]


def _rows_key(answer: dict[str, Any]) -> str | None:
    """The answer's list of rows: its first field holding a list of objects (or an empty list)."""
    for key, value in answer.items():
        if isinstance(value, list) and (not value or all(isinstance(v, dict) for v in value)):
            return key
    return None


def _field_lines(answer: dict[str, Any], skip: set[str]) -> list[str]:
    lines: list[str] = []
    for key, value in answer.items():
        if key in skip:
            continue
        if _scalar(value):
            lines.append(f"{key}: {cell(value)}")
            continue
        compact = cell(value)
        if len(compact) <= 100:
            lines.append(f"{key}: {compact}")
        else:
            pretty = json.dumps(value, indent=2, ensure_ascii=False).replace("\n", "\n  ")
            lines.append(f"{key}:\n  {pretty}")
    return lines


def render(answer: Any, columns: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """An answer as table text: (lines for standard output, hints for standard error)."""
    if not isinstance(answer, dict):
        return [cell(answer)], []
    if len(answer) == 1:
        [inner] = answer.values()
        if isinstance(inner, dict) and _rows_key(inner) is None:  # {"todo": {...}}: the object itself
            return _field_lines(inner, set()), []
    key = _rows_key(answer)
    if key is None:
        return _field_lines(answer, set()), []
    rows: list[dict[str, Any]] = answer[key]
    lines = table(rows, columns) if rows else [f"(no {key})"]
    rest = _field_lines(answer, {key, "next_cursor"})
    if rest:
        lines += ["", *rest]
    hints = [f"more: --cursor {answer['next_cursor']}"] if answer.get("next_cursor") else []
    return lines, hints


def emit(answer: Any, how: Mode, columns: tuple[str, ...] = ()) -> None:
    """Print one answer on standard output (hints on standard error)."""
    if how == "json":
        print(json.dumps(answer, indent=2, ensure_ascii=False))
        return
    lines, hints = render(answer, columns)
    print("\n".join(lines))
    for hint in hints:
        print(hint, file=sys.stderr)
