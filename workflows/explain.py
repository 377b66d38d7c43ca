"""What the Temporal UI shows of a decided delivery: its end details.

Pure functions (no I/O, no clock), so the workflow may call them and replay computes the same text. Producer
text is cleaned to one line, capped, and escaped (routing.delivery.plain). The summary line and start details
are the receiver's (routing.delivery).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from routing.delivery import CommitResult, plain

# Details are a short card. The server caps user metadata too (20 KB details in current releases), so ours stays
# well inside.
MAX_DETAILS_FAULTS = 10
MAX_DETAILS_TODOS = 20
# Keyword search attribute values are indexed whole; a producer id longer than this is not a real one.
MAX_ATTRIBUTE_CHARS = 256


def end_details(result: CommitResult, faults: object = None) -> str:
    """Markdown for the run's current details once it is decided: decision, rule, event, todos, faults."""
    outcome = result.status if result.status != "committed" else result.disposition
    flags = [name for name in ("duplicate", "repeat") if getattr(result, name)]
    lines = [f"**decision** {plain(outcome)}" + (f" ({', '.join(flags)})" if flags else "")]
    if result.quarantine_reason:
        lines.append(f"**held for a person** ({plain(result.quarantine_reason)}): release_webhook_event routes it")
    if result.rule_id:
        lines.append(f"**rule** `{plain(result.rule_id)}`")
    if result.event_id:
        lines.append(f"**event** `{plain(result.event_id)}`")
    if result.todos:
        shown = result.todos[:MAX_DETAILS_TODOS]
        items = [
            f"- `{plain(t.id)}` {plain(t.queue)} @ `{plain(t.endpoint_id)}`" + ("" if t.created else " (existing)")
            for t in shown
        ]
        if len(result.todos) > len(shown):
            items.append(f"- … {len(result.todos) - len(shown)} more")
        lines.append(f"**todos** {len(result.todos)} ({result.created} new)\n" + "\n".join(items))
    elif result.status == "committed":
        lines.append("**todos** none")
    fault_list = [f for f in faults if isinstance(f, Mapping)] if isinstance(faults, Sequence) else []
    if fault_list:
        shown_faults = fault_list[:MAX_DETAILS_FAULTS]
        items = [_fault_line(f) for f in shown_faults]
        if len(fault_list) > len(shown_faults):
            items.append(f"- … {len(fault_list) - len(shown_faults)} more")
        lines.append(f"**faults** {len(fault_list)}\n" + "\n".join(items))
    return "\n\n".join(lines)


def _fault_line(fault: Mapping[str, Any]) -> str:
    """One fault: which rule, the cause, the (cut) detail."""
    rule = fault.get("rule_id") or f"rule {fault.get('rule_index', '?')}"
    line = f"- {plain(rule)}: {plain(fault.get('cause', 'error'))}"
    detail = fault.get("detail")
    if detail:
        line += f" — {plain(detail)}"
    return line
