"""Grounding the rule compiler's prompt: the paths (and, where allowed, values) that exist in sampled envelopes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from routing.filters.language import MAX_PATH_SEGMENTS, Reply, json_equal, render_path

MAX_PATHS = 256
MAX_VALUES_PER_PATH = 8
MAX_VALUE_CHARS = 80
# Switchboard derives these top-level fields itself (SPEC-0020 envelope); their values are not the
# producer's content, so they are always shown. Every other value is shown only when the owner allowed
# payload egress (the triage configuration's include_payload).
DERIVED_FIELDS = ("source", "kind", "trust_mode", "verified", "content_type")
# Constant per webhook, and an identifier: never a routing condition worth offering.
HIDDEN_FIELDS = frozenset({"webhook_id"})


class GroundedPath(BaseModel):
    """One path that exists in the sample, with example values when they may be shown."""

    path: str
    values: list[Any] | None = Field(default=None, description="distinct example values; null: withheld")


def _walk(value: Any, prefix: tuple[str, ...], out: dict[tuple[str, ...], list[Any]]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            if not isinstance(key, str) or (not prefix and key in HIDDEN_FIELDS):
                continue
            path = (*prefix, key)
            if len(path) > MAX_PATH_SEGMENTS:
                continue
            out.setdefault(path, [])
            _record(out[path], sub)
            _walk(sub, path, out)
    elif isinstance(value, list):
        for element in value:
            if isinstance(element, dict):
                _walk(element, prefix, out)


def _record(seen: list[Any], value: Any) -> None:
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict | list) or len(seen) >= MAX_VALUES_PER_PATH:
            continue
        if isinstance(item, str) and len(item) > MAX_VALUE_CHARS:
            continue  # a cut string would be a value no event has
        if not any(json_equal(item, s) for s in seen):
            seen.append(item)


def _shown_first(path: tuple[str, ...]) -> tuple[int, bool, str]:
    # Shallow paths first; the many *_url links of forge payloads last, they rarely route anything.
    last = path[-1]
    return len(path), last == "url" or last.endswith("_url"), render_path(path)


class Sample:
    """Paths, example values and kinds accumulated over sampled envelopes, one at a time (bounded memory)."""

    def __init__(self) -> None:
        self.events = 0
        self._found: dict[tuple[str, ...], list[Any]] = {}
        self._kinds: set[str] = set()

    def add(self, envelope: Mapping[str, Any]) -> None:
        """Take in one envelope's paths, values and kind."""
        self.events += 1
        _walk(dict(envelope), (), self._found)
        kind = envelope.get("kind")
        if isinstance(kind, str):
            self._kinds.add(kind)

    def grounded(self, *, values: bool, max_paths: int = MAX_PATHS) -> list[GroundedPath]:
        """The paths seen (at most ``max_paths``, shallow first), values only as allowed."""
        chosen = sorted(self._found, key=_shown_first)[:max_paths]
        out = []
        for path in chosen:
            shown = values or (len(path) == 1 and path[0] in DERIVED_FIELDS)
            out.append(GroundedPath(path=render_path(path), values=list(self._found[path]) if shown else None))
        return out

    def kinds(self) -> list[str]:
        """The distinct kinds seen, sorted."""
        return sorted(self._kinds)


def ground(envelopes: Sequence[Mapping[str, Any]], *, values: bool, max_paths: int = MAX_PATHS) -> list[GroundedPath]:
    """The paths existing in the envelopes (at most ``max_paths``, shallow first), values only as allowed."""
    sample = Sample()
    for envelope in envelopes:
        sample.add(envelope)
    return sample.grounded(values=values, max_paths=max_paths)


# ---------------------------------------------------------------------------------------------------
# The response schema handed to the provider
# ---------------------------------------------------------------------------------------------------


def _plain(node: Any) -> Any:
    # Providers' constrained decoders (OpenAI strict mode, llama.cpp grammars) take anyOf, not pydantic's
    # oneOf + discriminator; the Literal tags still tell the branches apart.
    if isinstance(node, dict):
        out = {
            k: ({name: _plain(sub) for name, sub in v.items()} if k == "properties" else _plain(v))
            for k, v in node.items()
            if k not in ("discriminator", "title")
        }
        if "oneOf" in out:
            out["anyOf"] = out.pop("oneOf")
        return out
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def response_schema(paths: Sequence[str], queues: Sequence[str]) -> dict[str, Any]:
    """Reply's JSON schema with the grounded paths and the granted queues as enums.

    A provider that enforces the schema can then only name paths that exist and queues that are granted;
    the answer is validated again all the same (parse_reply, ungrounded, the save-time rule validation).
    """
    schema: dict[str, Any] = _plain(Reply.model_json_schema())
    defs = schema["$defs"]
    for name in ("Eq", "In", "Exists"):
        prop = defs[name]["properties"]["path"]
        if paths:
            prop["enum"] = list(paths)
    if not paths:
        # Nothing sampled: a filter can still select kinds, but name no path.
        defs["FilterAnswer"]["properties"]["where"] = {"type": "null"}
        for name in ("Eq", "In", "Exists", "AllOf", "AnyOf", "Not"):
            defs.pop(name)
    defs["QueueTo"]["properties"]["queue"]["enum"] = list(queues)
    return schema
