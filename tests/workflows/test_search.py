"""The search attributes are one list (workflows/search.py) that every place registering them follows."""

from __future__ import annotations

from pathlib import Path

from cli.embedded import search_attribute_args
from workflows import search

ROOT = Path(__file__).resolve().parents[2]


def test_every_registration_names_the_same_search_attributes() -> None:
    names = [key.name for key in search.ALL]
    assert "SwitchboardRerouteOf" in names
    # The dev server (switchboard dev, the test suite, the fault campaign) and the deploy script.
    assert search_attribute_args() == [arg for name in names for arg in ("--search-attribute", f"{name}=Keyword")]
    script = (ROOT / "deploy/temporal/register-search-attributes.sh").read_text()
    assert script.split("ATTRIBUTES=(", 1)[1].split(")", 1)[0].split() == names
    production = (ROOT / "docs/production.md").read_text()
    assert all(f"--name {name} " in production for name in names)
