"""What the Temporal UI shows of a delivery: its summary line, start details, activity summaries, end details.

Pure functions (no I/O, no clock), so the workflow may call them and replay computes the same text. Producer
text (repository names, kinds, titles) is cleaned to one line, capped, and has Temporal-markdown characters
escaped: a delivery cannot put links, images or layout into an operator's UI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from routing.delivery import CommitResult, DeliveryInput
from routing.sources import producer_delivery_id

# A summary is one line in the workflow list; details are a short card. The server caps user metadata too
# (400 B summary / 20 KB details in current releases), so ours stays well inside.
MAX_SUMMARY_CHARS = 200
MAX_FIELD_CHARS = 120
MAX_DETAILS_FAULTS = 10
MAX_DETAILS_TODOS = 20
# Keyword search attribute values are indexed whole; a producer id longer than this is not a real one.
MAX_ATTRIBUTE_CHARS = 256

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
# Only what builds links, images, HTML or code spans; "#" mid-line and "_" stay readable in the CLI's raw view.
_MARKDOWN = re.compile(r"([\\`\[\]()<>])")


def plain(value: object, limit: int = MAX_FIELD_CHARS) -> str:
    """Producer text as one escaped markdown line of at most ``limit`` characters (before escaping)."""
    text = _CONTROL.sub(" ", str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _MARKDOWN.sub(r"\\\1", text)


def _subject(payload: Any, issue: Mapping[str, Any] | None, artifact: Mapping[str, Any] | None) -> str | None:
    """owner/repo#number for an issue or pull request, cairn:<id> for an artifact, else the repository."""
    if issue is not None and issue.get("repo") and issue.get("number"):
        return f"{issue['repo']}#{issue['number']}"
    if artifact is not None and isinstance(artifact.get("id"), str):
        return f"cairn:{artifact['id']}"
    if not isinstance(payload, dict):
        return None
    repository = payload.get("repository")
    repo = repository.get("full_name") if isinstance(repository, dict) else None
    number = None
    for name in ("pull_request", "issue"):
        item = payload.get(name)
        if isinstance(item, dict) and isinstance(item.get("number"), int) and not isinstance(item["number"], bool):
            number = item["number"]
            break
    if isinstance(repo, str) and repo:
        return f"{repo}#{number}" if number is not None else repo
    return None


def summary_line(delivery: DeliveryInput, envelope: Mapping[str, Any] | None) -> str:
    """One line for the workflow list: source, kind, action and subject (``github issues opened acme/app#12``)."""
    payload = envelope.get("payload") if envelope is not None else None
    issue = envelope.get("issue") if envelope is not None else None
    artifact = envelope.get("artifact") if envelope is not None else None
    kind = delivery.kind or (envelope.get("kind") if envelope is not None else None)
    action = payload.get("action") if isinstance(payload, dict) else None
    parts = [delivery.source]
    if isinstance(kind, str) and kind:
        parts.append(kind)
    if isinstance(action, str) and action:
        parts.append(action)
    subject = _subject(
        payload,
        issue if isinstance(issue, Mapping) else None,
        artifact if isinstance(artifact, Mapping) else None,
    )
    if subject:
        parts.append(subject)
    return plain(" ".join(parts), MAX_SUMMARY_CHARS)


def start_details(delivery: DeliveryInput) -> str:
    """Fixed markdown details of the delivery as received: webhook, producer id, trust, size."""
    size = delivery.size()
    lines = [
        f"**webhook** `{plain(delivery.webhook_id)}` · endpoint `{plain(delivery.endpoint_id)}`",
        f"**delivery** `{plain(delivery.external_id)}`",
        f"**trust** {plain(delivery.trust_mode)} · verified {'yes' if delivery.verified else 'no'}"
        f" ({plain(delivery.verify_detail)})",
        f"**body** about {size} bytes, {plain(delivery.content_type or 'no content type')}",
        f"**received** {plain(delivery.received_at)}",
    ]
    return "\n\n".join(lines)


def delivery_attribute(delivery: DeliveryInput, envelope: Mapping[str, Any] | None) -> str | None:
    """The producer's own delivery id (routing.sources), for the SwitchboardDeliveryId search attribute."""
    payload = envelope.get("payload") if envelope is not None else None
    found = producer_delivery_id(delivery.source, delivery.headers, payload)
    if not found or len(found) > MAX_ATTRIBUTE_CHARS:
        return None
    return found


def end_details(result: CommitResult, faults: object = None) -> str:
    """Markdown for the run's current details once it is decided: decision, rule, event, todos, faults."""
    outcome = result.status if result.status != "committed" else result.disposition
    flags = [name for name in ("duplicate", "repeat") if getattr(result, name)]
    lines = [f"**decision** {plain(outcome)}" + (f" ({', '.join(flags)})" if flags else "")]
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


# The receiver parses a body once already: a JSON body travels as its value, and a huge one that does not is
# not parsed again only to name its subject here.
MAX_DESCRIBED_BODY = 1 << 20


def received_envelope(delivery: DeliveryInput) -> dict[str, Any] | None:
    """The envelope the start's summary and producer id are read from; None for a body too large to parse again."""
    if delivery.body_layout is None and delivery.size() > MAX_DESCRIBED_BODY:
        return None
    return delivery.envelope()
