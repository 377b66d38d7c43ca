"""Generic collectors: per-webhook configuration that turns "anything that can POST" into routable events.

Pure: no I/O. The receiver derives .kind here, the decision derives coalescing subjects here, and the
configure_webhook verb validates configuration here, so a new external source is configuration, not code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from routing.envelope import derive_kind
from routing.signatures import GenericHmac
from routing.sources import CLOUDEVENTS_STRUCTURED, find_source, media_type
from routing.text import MAX_KIND_CHARS, MAX_SUBJECT_CHARS, cap_text, clean_text

MAX_PATH_SEGMENTS = 16

# A simple dotted path: object keys (and list indexes) separated by dots, optionally led by one dot
# (jq style). No wildcards, filters or quoting: the path is configuration evaluated on every delivery.
_PATH = re.compile(r"\.?[A-Za-z0-9_\-]{1,64}(?:\.[A-Za-z0-9_\-]{1,64})*")
# RFC 9110 token characters, narrowed to what a sane signature header name uses.
_HEADER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-_]{0,63}")


def parse_path(path: str) -> list[str]:
    """The segments of a simple dotted path; ValueError when it is not one."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise ValueError("must be a simple dotted path such as data.type or .event.kind")
    segments = path.lstrip(".").split(".")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise ValueError(f"has {len(segments)} segments; the limit is {MAX_PATH_SEGMENTS}")
    return segments


def lookup(value: Any, path: str) -> Any:
    """The value at a simple dotted path (numeric segments index lists), or None when absent."""
    try:
        segments = parse_path(path)
    except ValueError:
        return None
    for segment in segments:
        if isinstance(value, dict):
            value = value.get(segment)
        elif isinstance(value, list) and segment.isdigit():
            index = int(segment)
            value = value[index] if index < len(value) else None
        else:
            return None
    return value


def _scalar_text(value: Any, limit: int) -> str | None:
    """A string or integer as non-empty text within limit characters; anything else is None."""
    if isinstance(value, bool):
        return None
    text = str(value) if isinstance(value, int) else value
    if not isinstance(text, str):
        return None
    # NUL or a lone surrogate would make the value unstorable: U+FFFD stands in (routing.text).
    text = clean_text(text.strip())
    if not text or len(text) > limit:
        return None
    return text


class HmacConfig(BaseModel):
    """Graduated trust: which header carries an HMAC-SHA256 of the raw body, and its encoding."""

    model_config = ConfigDict(extra="forbid")

    header: str = Field(min_length=1, max_length=64, description="the request header carrying the signature")
    format: Literal["sha256=hex", "hex", "base64"] = Field(
        default="sha256=hex", description="how the HMAC-SHA256 is encoded in that header"
    )

    @field_validator("header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        if not _HEADER_NAME.fullmatch(value):
            raise ValueError("must be a header name (letters, digits, '-' and '_')")
        return value.lower()

    def scheme(self) -> GenericHmac:
        """The verification scheme routing.signatures applies."""
        return GenericHmac(header=self.header, format=self.format)


class KindConfig(BaseModel):
    """How a generic delivery's .kind is derived: a fixed value, a named header, or a JSON path."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["fixed", "header", "json_path"] = Field(description="where .kind comes from")
    value: str = Field(
        min_length=1, max_length=256, description="the fixed kind, the header name, or a dotted path into the payload"
    )
    default: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KIND_CHARS,
        description="the kind when the header or path (or a CloudEvents type) yields none",
    )

    @model_validator(mode="after")
    def _check_value(self) -> KindConfig:
        if self.mode == "header":
            if not _HEADER_NAME.fullmatch(self.value):
                raise ValueError("value must be a header name for mode header")
            self.value = self.value.lower()
        elif self.mode == "json_path":
            try:
                parse_path(self.value)
            except ValueError as exc:
                raise ValueError(f"value {exc}") from exc
        return self


class CollectorConfig(BaseModel):
    """A webhook's collector configuration, stored under endpoint_webhooks.config["collector"]."""

    model_config = ConfigDict(extra="forbid")

    hmac: HmacConfig | None = Field(
        default=None, description="verify an HMAC of the raw body (generic only); null: token trust only"
    )
    kind: KindConfig | None = Field(default=None, description="how .kind is derived (generic only)")
    subject_path: str | None = Field(
        default=None, max_length=256, description="a dotted path into the payload that keys coalescing"
    )

    @field_validator("subject_path")
    @classmethod
    def _subject_path(cls, value: str | None) -> str | None:
        if value is not None:
            parse_path(value)
        return value


class BrokenCollectorConfig(ValueError):
    """A stored collector configuration that no longer parses; the receiver answers 503 and accepts nothing."""


def stored_collector_config(config: Mapping[str, Any] | None) -> CollectorConfig:
    """The collector configuration stored on a webhook (absent means none); BrokenCollectorConfig when unreadable.

    Fail closed: an unreadable configuration may have held an HMAC requirement, so it must never be read as
    "no collector", which would accept deliveries unverified.
    """
    raw = (config or {}).get("collector")
    if raw is None:
        return CollectorConfig()
    if not isinstance(raw, dict):
        raise BrokenCollectorConfig("collector configuration is not an object")
    try:
        return CollectorConfig.model_validate(raw)
    except ValueError as exc:
        raise BrokenCollectorConfig("collector configuration does not parse") from exc


def collector_config(config: Mapping[str, Any] | None) -> CollectorConfig:
    """The collector configuration for deriving kind and subject; an unreadable one derives nothing.

    Only the receiver decides whether a delivery is accepted, and it reads stored_collector_config first, so
    no delivery reaches a caller of this function under a configuration that does not parse.
    """
    try:
        return stored_collector_config(config)
    except BrokenCollectorConfig:
        return CollectorConfig()


def is_structured_cloudevent(content_type: str | None) -> bool:
    """True for a CloudEvents structured-mode body (application/cloudevents+json)."""
    return media_type(content_type) == CLOUDEVENTS_STRUCTURED


def cloudevent(headers: Mapping[str, str], payload: Any) -> dict[str, str | None] | None:
    """A delivery's CloudEvents attributes {mode, id, source, type}, or None when it is not one.

    Binary mode carries them in ce-* headers; structured mode in the JSON body.
    """
    if is_structured_cloudevent(headers.get("content-type")):
        if not isinstance(payload, dict):
            return None
        return {
            "mode": "structured",
            "id": _scalar_text(payload.get("id"), MAX_KIND_CHARS),
            "source": _scalar_text(payload.get("source"), 1024),
            "type": _scalar_text(payload.get("type"), MAX_KIND_CHARS),
        }
    if "ce-type" in headers or "ce-id" in headers:
        return {
            "mode": "binary",
            "id": _scalar_text(headers.get("ce-id"), MAX_KIND_CHARS),
            "source": _scalar_text(headers.get("ce-source"), 1024),
            "type": _scalar_text(headers.get("ce-type"), MAX_KIND_CHARS),
        }
    return None


def derive_generic_kind(
    config: CollectorConfig, headers: Mapping[str, str], payload: Any, forge_kind: str | None = None
) -> str | None:
    """A generic delivery's .kind: the configured header or JSON path, else the CloudEvents type, else the
    configured default (a fixed kind is the default), else the forge event header (forge_kind).

    A kind the delivery does not carry falls back rather than dropping the event.
    """
    spec = config.kind
    if spec is not None and spec.mode == "header":
        found = _scalar_text(headers.get(spec.value), MAX_KIND_CHARS)
        if found is not None:
            return found
    if spec is not None and spec.mode == "json_path":
        found = _scalar_text(lookup(payload, spec.value), MAX_KIND_CHARS)
        if found is not None:
            return found
    ce = cloudevent(headers, payload)
    if ce is not None and ce["type"] is not None:
        return ce["type"]
    if spec is not None:
        if spec.mode == "fixed":
            return spec.value
        if spec.default is not None:
            return spec.default
    return forge_kind


def delivery_kind(
    source: str, config: Mapping[str, Any] | None, headers: Mapping[str, str], payload: Any
) -> str | None:
    """A delivery's .kind exactly as the receiver derives it; the dry-run uses the same function."""
    kind = derive_kind(source, headers, payload)
    row = find_source(source)
    if row is not None and row.collector:
        kind = derive_generic_kind(collector_config(config), headers, payload, forge_kind=kind)
    # Capped here too: a fixed kind or a default is stored configuration, but every .kind gets one rule.
    return None if kind is None else cap_text(kind, MAX_KIND_CHARS)


def path_subject(envelope: Mapping[str, Any] | None, path: str | None, webhook_id: str) -> str | None:
    """A coalescing subject key from the webhook's subject_path into .payload, scoped to the webhook.

    Scoped because two unrelated producers may use the same identifiers; attaching one's update to the
    other's todo would silently swallow work.
    """
    if envelope is None or not path:
        return None
    value = _scalar_text(lookup(envelope.get("payload"), path), MAX_SUBJECT_CHARS)
    if value is None:
        return None
    return f"{envelope.get('source')}:{webhook_id}:{value}"
