"""Files Switchboard ships beside its code (migrations, rule packs), found in the installed copy or the checkout.

Both folders are data packages (pyproject.toml), so importlib.resources finds them wherever the code was
installed from: an editable checkout, a wheel, or the image. Imports only the standard library, so the store
and the CLI can both use it.
"""

from __future__ import annotations

import re
from importlib.resources import files
from importlib.resources.abc import Traversable

MIGRATIONS_PACKAGE = "migrations"
RULE_PACKS_PACKAGE = "rule_packs"

_MIGRATION_NAME = re.compile(r"[0-9]{4}_.*\.sql")


def migrations_folder() -> Traversable:
    """The folder holding the numbered migrations."""
    return files(MIGRATIONS_PACKAGE)


def migration_files(folder: Traversable | None = None) -> list[Traversable]:
    """The numbered migrations (`NNNN_name.sql`) of `folder` (default: the shipped ones), in order."""
    where = migrations_folder() if folder is None else folder
    return sorted((f for f in where.iterdir() if _MIGRATION_NAME.fullmatch(f.name)), key=lambda f: f.name)


def rule_packs_folder() -> Traversable:
    """The folder holding the shipped rule packs (`docs/routing/rule-packs/` in the checkout)."""
    return files(RULE_PACKS_PACKAGE)


def rule_pack_names() -> list[str]:
    """Names of the shipped rule packs (file names without `.json`), sorted."""
    return sorted(f.name.removesuffix(".json") for f in rule_packs_folder().iterdir() if f.name.endswith(".json"))


def rule_pack(name: str) -> Traversable:
    """The shipped rule pack `name` (e.g. "fleet"); reading it raises FileNotFoundError when there is none."""
    return rule_packs_folder() / f"{name}.json"
