"""The routing envelope: one JSON document built identically by the receiver, dry-run and backtest."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any

from routing.sources import FORGE_KIND, find_source
from routing.text import (
    MAX_KIND_CHARS,
    MAX_SUBJECT_CHARS,
    cap_text,
    clean_json,
    loads_bounded,
    may_hold_surrogate,
    replace_lone_surrogates,
)
from routing.trust import actor_projection

CAIRN_HANDLE_PREFIX = "mcp://cairn/"
LABEL_ACTIONS = frozenset({"labeled", "unlabeled", "label_updated", "label_cleared"})
# GitHub names the changed label only on these actions; Gitea's label_updated never says which moved.
CHANGED_LABEL_ACTIONS = frozenset({"labeled", "unlabeled"})
ARTIFACT_DATA_FIELDS = (
    "id",
    "url",
    "title",
    "share_type",
    "channel",
    "model",
    "actor_id",
    "on_behalf_of",
    "expires_at",
    "tags",
    "metadata",
)
ENVELOPE_KEYS = (
    "source",
    "kind",
    "webhook_id",
    "trust_mode",
    "verified",
    "content_type",
    "size",
    "headers",
    "payload",
    "artifact",
    "issue",
    "actor",
    "release",
)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


class _NotJSON(ValueError):
    """A body token that strict JSON does not allow (NaN, Infinity)."""


def _parse_int(text: str) -> int | float:
    """Integers that fit int64 stay exact; wider ones degrade to float as every other reader would."""
    value = int(text)
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    return _parse_float(text)


def _parse_float(text: str) -> float:
    """A float, clamped like jq clamps out-of-range literals so the envelope stays encodable JSON."""
    value = float(text)
    if value == float("inf"):
        return sys.float_info.max
    if value == float("-inf"):
        return -sys.float_info.max
    return value


def _reject_constant(text: str) -> Any:
    """NaN and Infinity are Python extensions, not JSON, so a body using them is not JSON."""
    raise _NotJSON(text)


def parse_payload_checked(body: bytes) -> tuple[Any, bool]:
    """The body as exactly one JSON value (or None), and whether a lone surrogate in it was replaced.

    None too for a body nested deeper than MAX_JSON_DEPTH (routing/text.py): it routes on `.payload: null` and its
    todos have no jsonb copy, like a body that is not JSON; the event keeps its bytes either way.

    The rule for .payload (docs/rules.md): each lone surrogate escape (``"\\ud800"``) in a string
    or key becomes U+FFFD, so rules still route on every other field and the envelope stays encodable as
    UTF-8; NUL stays as sent. The raw body is what the event keeps; the todo's jsonb copy is then null.
    """
    try:
        # Decode as UTF-8 ourselves: json.loads(bytes) would also sniff UTF-16/32, which no producer sends.
        text = body.decode("utf-8")
        # Past the one JSON depth limit (JsonTooDeep, a ValueError) the body is bytes only: no .payload, no jsonb copy.
        value = loads_bounded(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError):
        return None, False
    if may_hold_surrogate(body):
        return replace_lone_surrogates(value)
    return value, False


def parse_payload(body: bytes) -> Any:
    """The body as exactly one JSON value, or None; lone surrogates replaced (parse_payload_checked)."""
    return parse_payload_checked(body)[0]


def derive_kind(source: str, headers: Mapping[str, str], payload: Any) -> str | None:
    """.kind by the source type's kind rule (routing/sources.py): a signed body field, else its event headers."""
    row = find_source(source)
    rule = row.kind if row is not None else FORGE_KIND
    if rule.body_paths:
        # A body-kinded source never falls back to a header: the headers are unsigned (cairn's X-Cairn-Event).
        for path in rule.body_paths:
            value = payload
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, str) and value:
                return cap_text(value, MAX_KIND_CHARS)
        return None
    for name in rule.headers:
        value = headers.get(name)
        if value:
            return cap_text(value, MAX_KIND_CHARS)
    return None


def _str_or_none(value: Any) -> str | None:
    """Producer fields are untyped; anything but a string projects as null."""
    return value if isinstance(value, str) else None


def _login(value: Any) -> str | None:
    """A forge user object's login, or None."""
    return _str_or_none(value.get("login")) if isinstance(value, dict) else None


def _present(value: Any) -> bool:
    """A JSON member that exists and is not null."""
    return value is not None


def build_artifact(payload: Any) -> dict[str, Any]:
    """The .artifact projection of a cairn body; every listed field present, absent ones null."""
    root = payload if isinstance(payload, dict) else {}
    data = root.get("data")
    data = data if isinstance(data, dict) else {}
    out: dict[str, Any] = {
        "event_id": root.get("event_id"),
        "kind": root.get("kind"),
        "created_at": root.get("created_at"),
    }
    for name in ARTIFACT_DATA_FIELDS:
        out[name] = data.get(name)
    # tags are cairn's string list: passed through when a list, null otherwise (never coerced).
    if not isinstance(out["tags"], list):
        out["tags"] = None
    artifact_id = data.get("id")
    out["handle"] = CAIRN_HANDLE_PREFIX + artifact_id if isinstance(artifact_id, str) and artifact_id else None
    # Projections feed work orders and subject keys (jsonb and text columns): no NUL may reach them.
    cleaned: dict[str, Any] = clean_json(out)
    return cleaned


def build_issue(source: str, headers: Mapping[str, str], payload: Any) -> dict[str, Any] | None:
    """The .issue projection (SPEC-0020 "Issue Envelope Projection"), or None when not an issue."""
    row = find_source(source)
    if row is None or row.issue_provider is None:
        return None
    gitea_event = headers.get("x-gitea-event")
    github_event = headers.get("x-github-event")
    event = gitea_event or github_event
    if event != "issues":
        return None
    if row.issue_provider == "event_header":
        provider = "gitea" if gitea_event else "github"
    else:
        provider = source
    if not isinstance(payload, dict):
        return None
    issue = payload.get("issue")
    if not isinstance(issue, dict):
        return None
    # A pull request is never an issue, whichever way the forge marks it.
    if _present(payload.get("pull_request")) or _present(issue.get("pull_request")):
        return None
    number = issue.get("number")
    if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
        return None
    repository = payload.get("repository")
    repo = _str_or_none(repository.get("full_name")) if isinstance(repository, dict) else None
    raw_labels = issue.get("labels")
    labels: list[str] = []
    if isinstance(raw_labels, list):
        for entry in raw_labels:
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str):
                labels.append(name)
    action = _str_or_none(payload.get("action"))
    label: str | None = None
    changed = payload.get("label")
    if action in CHANGED_LABEL_ACTIONS and isinstance(changed, dict):
        label = _str_or_none(changed.get("name"))
    body = issue.get("body")
    key = f"{provider}:{repo}#{number}" if repo else None
    if key is not None and len(key) > MAX_SUBJECT_CHARS:
        # No real repository name is this long; a key cut short could merge two issues, so there is none.
        key = None
    projection: dict[str, Any] = {
        "provider": provider,
        "action": action,
        "event_type": headers.get("x-gitea-event-type") or "issues",
        "repo": repo,
        "number": number,
        "title": _str_or_none(issue.get("title")),
        "url": _str_or_none(issue.get("html_url")),
        "state": _str_or_none(issue.get("state")),
        "author": _login(issue.get("user")),
        "sender": _login(payload.get("sender")),
        "labels": labels,
        "label": label,
        "body_size": len(body.encode("utf-8")) if isinstance(body, str) else 0,
        "label_event": action in LABEL_ACTIONS,
        "key": key,
    }
    # Projections feed work orders and subject keys (jsonb and text columns): no NUL may reach them.
    cleaned: dict[str, Any] = clean_json(projection)
    return cleaned


def build_envelope(
    *,
    source: str,
    webhook_id: str,
    trust_mode: str,
    verified: bool,
    content_type: str | None,
    headers: Mapping[str, str],
    body: bytes | None,
    kind: str | None = None,
    parsed: tuple[Any, int] | None = None,
    trusted_actors: Any = None,
    release: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the routing envelope; switchboard-derived fields on top, producer content below.

    kind, when given, is the receiver's own derivation (a generic collector's configured kind rule or a
    CloudEvents type); otherwise .kind is derived here from the source's headers or signed body.
    ``parsed`` is (parse_payload(body), len(body)) when the caller parsed the body already (body is then None).
    ``trusted_actors`` is the webhook's stored gate (Grant.trusted_actors): it sets .actor's trust flags, null
    without one. ``release`` is a person's release of the delivery ({by, at}), shown as .release.
    """
    lowered = {str(name).lower(): str(value) for name, value in headers.items()}
    if parsed is not None:
        payload, size = parsed
    elif body is not None:
        payload, size = parse_payload(body), len(body)
    else:
        raise ValueError("an envelope is built from the body or its parsed value")
    # Every top-level key is assigned from switchboard state or a switchboard projection; nothing from
    # the payload is ever merged into this dict, so a producer cannot forge .verified or .source.
    return {
        "source": source,
        "kind": kind if kind is not None else derive_kind(source, lowered, payload),
        "webhook_id": webhook_id,
        "trust_mode": trust_mode,
        "verified": verified is True,
        "content_type": content_type or None,
        "size": size,
        "headers": lowered,
        "payload": payload,
        "artifact": build_artifact(payload) if source == "cairn" else None,
        "issue": build_issue(source, lowered, payload),
        "actor": actor_projection(source, payload, trusted_actors),
        "release": dict(release) if release is not None else None,
    }


def _as_dict(value: Any) -> dict[str, Any] | None:
    """The value when it is a JSON object."""
    return value if isinstance(value, dict) else None


def subject_key(envelope: Mapping[str, Any] | None) -> str | None:
    """The delivery subject's key: provider:owner/repo#number for an issue, cairn:<id> for an artifact."""
    if envelope is None:
        return None
    issue = _as_dict(envelope.get("issue"))
    if issue is not None:
        key = issue.get("key")
        return key if isinstance(key, str) and key else None
    artifact = _as_dict(envelope.get("artifact"))
    if artifact is not None and envelope.get("source") == "cairn":
        artifact_id = artifact.get("id")
        if isinstance(artifact_id, str) and artifact_id and len(artifact_id) <= MAX_SUBJECT_CHARS:
            return "cairn:" + artifact_id
    return None


def once_key(subject: str | None, queue: str) -> str | None:
    """once: + hex SHA-256 of subject key NUL queue, or None when there is no subject to key on."""
    if not subject or not queue:
        return None
    digest = hashlib.sha256((subject + "\0" + queue).encode("utf-8")).hexdigest()
    return "once:" + digest


def issue_subject(envelope: Mapping[str, Any]) -> dict[str, Any] | None:
    """The work-order subject of an issue delivery, from switchboard's own .issue projection."""
    issue = _as_dict(envelope.get("issue"))
    if issue is None:
        return None
    subject: dict[str, Any] = {"type": "issue"}
    for name in (
        "provider",
        "action",
        "event_type",
        "repo",
        "number",
        "title",
        "url",
        "state",
        "author",
        "sender",
        "labels",
        "label",
        "body_size",
        "key",
    ):
        subject[name] = issue.get(name)
    subject["labels"] = list(subject["labels"] or [])
    return subject


def cairn_subject(envelope: Mapping[str, Any]) -> dict[str, Any] | None:
    """The work-order subject of a cairn artifact; tags keep only their string entries, in order."""
    if envelope.get("source") != "cairn":
        return None
    artifact = _as_dict(envelope.get("artifact"))
    if artifact is None:
        return None
    artifact_id = artifact.get("id")
    if not isinstance(artifact_id, str) or not artifact_id:
        return None
    raw_tags = artifact.get("tags")
    tags = [t for t in raw_tags if isinstance(t, str)] if isinstance(raw_tags, list) else []
    return {
        "type": "cairn_artifact",
        "id": artifact_id,
        "handle": CAIRN_HANDLE_PREFIX + artifact_id,
        "url": _str_or_none(artifact.get("url")),
        "title": _str_or_none(artifact.get("title")),
        "share_type": _str_or_none(artifact.get("share_type")),
        "actor_id": _str_or_none(artifact.get("actor_id")),
        # Display only: client-reported, never a trust input.
        "on_behalf_of": _str_or_none(artifact.get("on_behalf_of")),
        "tags": tags,
        "key": "cairn:" + artifact_id,
    }


def work_order_subject(envelope: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The issue or cairn subject a work order carries, or None when the delivery has none."""
    if envelope is None:
        return None
    return issue_subject(envelope) or cairn_subject(envelope)
