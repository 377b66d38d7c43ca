"""Rule actions: the one parser of an action's shape, shared by save-time validation and every delivery.

routing/rules.py validates a saved action with ``parse_action`` (and checks it against the grant), and
routing/decision.py re-parses every stored action with the same function before applying it, so a stored row
that bypassed validation can never mean something at delivery that a save would have refused. Pure and
stdlib only: a Temporal workflow imports this module inside its sandbox and must not need jq.
"""

from __future__ import annotations

from typing import Any

MAX_ENDPOINTS = 16
QUEUE_FLAGS = ("exclusive", "once", "work_order", "coalesce")
ACTION_KEYS = frozenset({"queue", "endpoints", "drop", "quarantine", *QUEUE_FLAGS})
# {"quarantine": true} holds a delivery for a person; a queue of that name would read as the same and is not.
QUARANTINE = "quarantine"
EXACTLY_ONE = 'action must be exactly one of {"queue": …}, {"drop": true} or {"quarantine": true}'


def _alone(action: dict[str, Any], key: str) -> dict[str, Any]:
    """``{key: true}`` and nothing else (drop, quarantine)."""
    if action[key] is not True:
        raise ValueError(f'a {key} action must be {{"{key}": true}}')
    extra = sorted(k for k in action if k != key)
    if extra:
        raise ValueError(f"{', '.join(extra)} not allowed on a {key}")
    return {key: True}


def parse_action(action: Any) -> dict[str, Any]:
    """Check an action's shape (exactly one of queue, drop or quarantine); raise ValueError with the reason."""
    if not isinstance(action, dict):
        raise ValueError("action must be an object")
    unknown = sorted(str(k) for k in action if k not in ACTION_KEYS)
    if unknown:
        raise ValueError(f"action has unknown field(s): {', '.join(unknown)}")
    kinds = [k for k in ("queue", "drop", QUARANTINE) if k in action]
    if len(kinds) != 1:
        raise ValueError(EXACTLY_ONE)
    if kinds[0] != "queue":
        return _alone(action, kinds[0])
    queue = action["queue"]
    if not isinstance(queue, str) or not queue:
        raise ValueError("queue must be a non-empty string")
    if queue == QUARANTINE:
        raise ValueError('the queue name "quarantine" is reserved; hold a delivery with {"quarantine": true}')
    out: dict[str, Any] = {"queue": queue}
    if "endpoints" in action:
        endpoints = action["endpoints"]
        if not isinstance(endpoints, list) or not all(isinstance(e, str) and e for e in endpoints):
            raise ValueError("endpoints must be a list of endpoint ids")
        if not endpoints:
            raise ValueError("endpoints must name at least one endpoint; omit it to reach every target")
        if len(endpoints) > MAX_ENDPOINTS:
            raise ValueError(f"{len(endpoints)} endpoints; the limit is {MAX_ENDPOINTS}")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError("endpoints must not repeat")
        out["endpoints"] = list(endpoints)
    for flag in QUEUE_FLAGS:
        if flag in action:
            if not isinstance(action[flag], bool):
                raise ValueError(f"{flag} must be true or false")
            out[flag] = action[flag]
    return out
