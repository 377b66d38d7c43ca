"""The settings reference stays true: its table is Settings, name for name and default for default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from switchboard.settings import Settings

SETTINGS_DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
PREFIX = "SWITCHBOARD_"
HEADER = "| setting | default | meaning |"


def settings_rows() -> list[tuple[list[str], str]]:
    """(env names, default cell) of each row of the settings table."""
    lines = SETTINGS_DOC.read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`([A-Z0-9_]+)`", cells[0])
        rows.append((names, cells[1]))
    return rows


def env_names() -> dict[str, Any]:
    """Each Settings field by its environment variable, with its default."""
    return {
        PREFIX + name.upper(): None if field.is_required() else field.default
        for name, field in Settings.model_fields.items()
    }


def shown(default: Any) -> str:
    """How the table writes a default."""
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if isinstance(default, Path):
        return f"./{default}"
    return str(default)


def test_every_setting_is_in_the_readme_table_and_nothing_else_is() -> None:
    table = [name for names, _ in settings_rows() for name in names]
    assert all(name.startswith(PREFIX) for name in table), table  # full names only: greppable, unambiguous
    assert len(table) == len(set(table)), "a setting listed twice"
    fields = env_names()
    assert sorted(set(fields) - set(table)) == [], "settings missing from the table in docs/settings.md"
    assert sorted(set(table) - set(fields)) == [], "docs/settings.md names settings that do not exist"


def test_readme_defaults_match_settings() -> None:
    fields = env_names()
    checked = 0
    for names, cell in settings_rows():
        values = re.findall(r"`([^`]*)`", cell)
        # Only cells that are nothing but literal values (`a` or `a` / `b`): prose defaults explain themselves.
        if len(values) != len(names) or cell != " / ".join(f"`{v}`" for v in values):
            continue
        for name, value in zip(names, values, strict=True):
            default = fields[name]
            assert default is not None, name
            assert value == shown(default), f"{name}: docs/settings.md says {value}, Settings says {default!r}"
            checked += 1
    assert checked >= 30  # the check must not pass by skipping every row
