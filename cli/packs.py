"""Rule packs for `switchboard rules install`: a shipped pack or a pack file, its queue table mapped onto the
endpoint's queues and its params applied, as one set_webhook_rules body (docs/rules.md, "Rule packs")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from switchboard import resources

RULE_PACKS = tuple(resources.rule_pack_names())  # ("fleet", "pool-review", "starter"): what the package ships


def load_pack(
    pack: str, params_file: str | None = None, params: list[str] | None = None, queues: list[str] | None = None
) -> dict[str, Any]:
    """A set_webhook_rules body (minus webhook_id) from a shipped pack name or a pack file, with params applied.

    A pack with a `queues` table (`{"bugs": "work", …}`) names those keys in its actions; each becomes the table's
    queue, or the one `--queue KEY=QUEUE` gives, so the pack installs on whichever queues the endpoint has.
    """
    loaded = pack_document(pack)
    mapping = _pack_queues(loaded, queues or [])
    body: dict[str, Any] = {"rules": [_mapped(rule, "action", mapping) for rule in loaded["rules"]]}
    if loaded.get("default_action") is not None:
        body["default_action"] = _mapped(loaded, "default_action", mapping)["default_action"]
    if loaded.get("on_fault") is not None:
        # The shipped packs hold on a fault: a gate that cannot be evaluated must not let a delivery past it.
        body["on_fault"] = loaded["on_fault"]
    values = loaded.get("params")
    if params_file is not None:
        values = json.loads(Path(params_file).read_text())
        if not isinstance(values, dict):
            raise ValueError(f"{params_file}: params must be a JSON object")
    for pair in params or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {pair!r}: expected KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        values = {**(values or {}), key: value}
    if values is not None:
        body["params"] = values
    return body


def pack_document(pack: str) -> dict[str, Any]:
    """A shipped pack by name, or a pack file, as written."""
    path = resources.rule_pack(pack) if pack in RULE_PACKS else Path(pack)
    loaded = json.loads(path.read_text())
    if not isinstance(loaded, dict) or not isinstance(loaded.get("rules"), list):
        raise ValueError(f"{path}: a pack is a JSON object with a rules list")
    return loaded


def _pack_queues(loaded: dict[str, Any], given: list[str]) -> dict[str, str] | None:
    """The pack's queue table with `--queue KEY=QUEUE` applied, or None for a pack that names its queues itself."""
    table = loaded.get("queues")
    if table is None:
        if given:
            raise ValueError("--queue: this pack names its queues itself (it has no queues table)")
        return None
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise ValueError("a pack's queues table maps each name to a queue")
    mapping = dict(table)
    for pair in given:
        key, sep, queue = pair.partition("=")
        if not sep or not queue:
            raise ValueError(f"--queue {pair!r}: expected NAME=QUEUE")
        if key not in mapping:
            raise ValueError(f"--queue {pair!r}: the pack's queues are {', '.join(mapping)}")
        mapping[key] = queue
    return mapping


def _mapped(holder: dict[str, Any], key: str, mapping: dict[str, str] | None) -> dict[str, Any]:
    """holder with its action's queue taken through the pack's queue table."""
    action = holder.get(key)
    if mapping is None or not isinstance(action, dict) or "queue" not in action:
        return holder
    if action["queue"] not in mapping:
        raise ValueError(f"an action names queue {action['queue']!r}, which is not in the pack's queues table")
    return {**holder, key: {**action, "queue": mapping[action["queue"]]}}


def pack_queues(body: dict[str, Any]) -> list[str]:
    """The queues a pack's rules and default action route to, sorted."""
    actions = [r.get("action") for r in body["rules"] if isinstance(r, dict)] + [body.get("default_action")]
    return sorted({a["queue"] for a in actions if isinstance(a, dict) and isinstance(a.get("queue"), str)})
