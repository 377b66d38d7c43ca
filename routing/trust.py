"""The trust gate: who sent a delivery (``.actor``), whether the webhook trusts them, and the quarantine it decides.

One module for the idea (STYLE rule 11). A webhook of a forge (github, gitea) or cairn source may carry
``trusted_actors``; ``parse_gate`` validates it at save time (create_webhook, set_webhook_trusted_actors) and
``read_gate`` reads the stored one on every delivery with the same parser, so a stored value that cannot be read
trusts no one. ``actor_projection`` is the envelope's ``.actor`` (routing.envelope builds it), and
``gate_decision`` is the first step of routing.router's composition: a gated delivery that is neither trusted
nor released is quarantined before any rule is evaluated. The workflow, the dry-run, the backtest and re-routes
all route through that one composition.

Pure and stdlib only (plus the pure routing models): a Temporal workflow imports it inside its sandbox.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from routing.models import Decision, Grant
from routing.sources import SOURCES, find_source
from routing.text import MAX_SUBJECT_CHARS, cap_text, clean_text

Match = Literal["sender", "author", "both"]
MATCHES: tuple[str, ...] = ("sender", "author", "both")
MAX_TRUSTED = 1000
MAX_NAME_CHARS = 256
# The source types a gate applies to, in table order (messages list them in this order).
GATED_SOURCES: tuple[str, ...] = tuple(row.name for row in SOURCES.values() if row.actor is not None)
# Why a delivery is quarantined: the gate, or a {"quarantine": true} rule or default.
QuarantineReason = Literal["untrusted_actor", "rule_action"]
UNTRUSTED_ACTOR: QuarantineReason = "untrusted_actor"
RULE_ACTION: QuarantineReason = "rule_action"
TRUST_GATE_STAGE = "trust_gate"

_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# Where a forge body names the person who wrote what the delivery is about, in the order .actor.author reads:
# the comment or review first (what was said), then the thread it was said on.
_SPEAKERS = ("comment", "review")
_THREADS = ("pull_request", "issue", "discussion")


class GateError(ValueError):
    """A trusted_actors value that is not a gate (the message says why)."""


def ascii_fold(login: str) -> str:
    """A login compared ASCII case-insensitively: only A-Z are folded, every other character stays as it is."""
    return login.translate(_ASCII_FOLD)


@dataclass(frozen=True)
class Gate:
    """A parsed gate. ``nobody`` is what a stored value that cannot be read becomes: it trusts no one."""

    allow_all: bool = False
    logins: frozenset[str] = frozenset()  # ascii-folded
    match: Match = "both"
    actor_ids: frozenset[str] = frozenset()
    nobody: bool = False

    def trusts(self, name: str | None) -> bool:
        """Whether one sender or author is trusted (a missing one never is, except under allow_all)."""
        if self.allow_all:
            return True
        if self.nobody or name is None:
            return False
        if self.actor_ids:
            return name in self.actor_ids
        return ascii_fold(name) in self.logins


NOBODY = Gate(nobody=True)


def _actor_kind(source: str) -> str | None:
    row = find_source(source)
    return row.actor if row is not None else None


def _names(value: Any, field: str) -> list[str]:
    """An allowlist: a list of distinct non-empty strings, in the owner's order (empty: trusts no one)."""
    if not isinstance(value, list):
        raise GateError(f"{field} must be a list of strings")
    if len(value) > MAX_TRUSTED:
        raise GateError(f"{field} has {len(value)} entries; the limit is {MAX_TRUSTED}")
    out: list[str] = []
    for entry in value:
        if not isinstance(entry, str) or not entry:
            raise GateError(f"{field} must be a list of non-empty strings")
        if len(entry) > MAX_NAME_CHARS:
            raise GateError(f"an entry of {field} is longer than {MAX_NAME_CHARS} characters")
        if entry not in out:
            out.append(entry)
    return out


def parse_gate(value: Any, source: str) -> tuple[dict[str, Any], Gate]:
    """A trusted_actors value, normalized for storage, and its gate; GateError says what is wrong with it.

    ``{"allow_all": true}`` | ``{"logins": [...], "match": "sender" | "author" | "both"}`` (forges; match
    defaults to "both") | ``{"actor_ids": [...]}`` (cairn).
    """
    kind = _actor_kind(source)
    if kind is None:
        raise GateError(f"trusted_actors applies to {', '.join(GATED_SOURCES)} webhooks, not {source}")
    if not isinstance(value, dict):
        raise GateError('trusted_actors must be an object: {"allow_all": true}, {"logins": …} or {"actor_ids": …}')
    keys = set(value)
    if "allow_all" in value:
        if value["allow_all"] is not True or keys != {"allow_all"}:
            raise GateError('allow_all stands alone and is true: {"allow_all": true}')
        return {"allow_all": True}, Gate(allow_all=True)
    if "logins" in value:
        if kind != "forge":
            raise GateError(f"logins gate forge webhooks; a {source} webhook trusts actor_ids")
        unknown = sorted(str(k) for k in keys - {"logins", "match"})
        if unknown:
            raise GateError(f"unknown field(s) beside logins: {', '.join(unknown)}")
        logins = _names(value["logins"], "logins")
        match = value.get("match", "both")
        if match == "sender" or match == "author" or match == "both":
            return {"logins": logins, "match": match}, Gate(logins=frozenset(map(ascii_fold, logins)), match=match)
        raise GateError(f"match must be one of {', '.join(MATCHES)}")
    if "actor_ids" in value:
        if kind != "cairn":
            raise GateError(f"actor_ids gate cairn webhooks; a {source} webhook trusts logins")
        if keys != {"actor_ids"}:
            unknown = sorted(str(k) for k in keys - {"actor_ids"})
            raise GateError(f"unknown field(s) beside actor_ids: {', '.join(unknown)}")
        ids = _names(value["actor_ids"], "actor_ids")
        return {"actor_ids": ids}, Gate(actor_ids=frozenset(ids))
    raise GateError('trusted_actors must be one of {"allow_all": true}, {"logins": …, "match": …} or {"actor_ids": …}')


def read_gate(stored: Any, source: str) -> Gate | None:
    """The gate a delivery is held to: None when none is configured; a value that cannot be read trusts no one."""
    if stored is None:
        return None
    try:
        return parse_gate(stored, source)[1]
    except GateError:
        return NOBODY


# ---------------------------------------------------------------------------------------------------
# .actor: who sent the delivery and who wrote what it is about
# ---------------------------------------------------------------------------------------------------


class _WrongType(Exception):
    """A field the projection reads is present with a value of the wrong type: the projection is empty."""


@dataclass(frozen=True)
class _People:
    """The sender, the author (.actor.author), and the authors author_trusted requires (all of them trusted)."""

    sender: str | None = None
    author: str | None = None
    required: tuple[str | None, ...] = (None,)


_EMPTY = _People()


def _object(container: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    """A member that must be an object: None when absent or null; _WrongType when it is anything else."""
    if container is None:
        return None
    value = container.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _WrongType(key)
    return value


def _login(user: Mapping[str, Any] | None) -> str | None:
    """A forge user object's login: None when absent, null or empty; _WrongType when not a string."""
    if user is None:
        return None
    value = user.get("login")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _WrongType("login")
    return value or None


def _first(*names: str | None) -> str | None:
    return next((n for n in names if n), None)


def _forge_people(source: str, payload: Mapping[str, Any]) -> _People:
    sender = _login(_object(payload, "sender"))
    speakers: list[str | None] = []
    spoke = False
    for key in _SPEAKERS:
        said = _object(payload, key)
        if said is None:
            continue
        spoke = True
        author = _login(_object(said, "user"))
        if author is None and key == "review" and source == "gitea" and said.get("user") is None:
            # Gitea's review events carry {type, content} without a user: the reviewer is the sender.
            author = sender
        speakers.append(author)
    threads: list[str | None] = []
    threaded = False
    for key in _THREADS:
        thread = _object(payload, key)
        if thread is not None:
            threaded = True
            threads.append(_login(_object(thread, "user")))
    speaker, thread_author = _first(*speakers), _first(*threads)
    required: list[str | None] = []
    if spoke:
        required.append(speaker)
    if threaded:
        required.append(thread_author)
    # An event about no comment, review or thread (a push, a fork, a star) is its sender's own doing.
    return _People(sender=sender, author=_first(speaker, thread_author), required=tuple(required) or (sender,))


def _cairn_people(payload: Mapping[str, Any]) -> _People:
    # The signed actor_id, which cairn derives from the authenticated caller; on_behalf_of is client-reported
    # display text and never read here.
    value = (_object(payload, "data") or {}).get("actor_id")
    if value is not None and not isinstance(value, str):
        raise _WrongType("actor_id")
    actor = value or None
    return _People(sender=actor, author=actor, required=(actor,))


def _people(source: str, payload: Any) -> _People | None:
    """Who sent the delivery and who wrote it; None for a source without an actor; empty when malformed."""
    kind = _actor_kind(source)
    if kind is None:
        return None
    if not isinstance(payload, dict):
        return _EMPTY
    try:
        return _forge_people(source, payload) if kind == "forge" else _cairn_people(payload)
    except _WrongType:
        return _EMPTY


def _shown(name: str | None) -> str | None:
    """A login or actor id as the envelope shows it: storable and capped (trust was decided on the raw value)."""
    return None if name is None else cap_text(clean_text(name), MAX_SUBJECT_CHARS)


def actor_projection(source: str, payload: Any, trusted_actors: Any) -> dict[str, Any]:
    """``.actor``: {sender, author, sender_trusted, author_trusted, trusted}; the flags are null without a gate."""
    people = _people(source, payload)
    gate = read_gate(trusted_actors, source)
    out: dict[str, Any] = {
        "sender": _shown(people.sender) if people else None,
        "author": _shown(people.author) if people else None,
        "sender_trusted": None,
        "author_trusted": None,
        "trusted": None,
    }
    if gate is None:
        return out
    seen = people or _EMPTY
    sender_trusted = gate.trusts(seen.sender)
    author_trusted = all(gate.trusts(name) for name in seen.required)
    if gate.actor_ids or gate.allow_all or gate.nobody:
        trusted = author_trusted and sender_trusted
    elif gate.match == "sender":
        trusted = sender_trusted
    elif gate.match == "author":
        trusted = author_trusted
    else:
        trusted = sender_trusted and author_trusted
    out.update(sender_trusted=sender_trusted, author_trusted=author_trusted, trusted=trusted)
    return out


# ---------------------------------------------------------------------------------------------------
# Release: a person's decision to route a quarantined delivery
# ---------------------------------------------------------------------------------------------------


class Release(BaseModel):
    """Who released a quarantined delivery and when; ``event_id`` is the quarantined event it released."""

    by: str  # "human:<id>" | "endpoint:<id>"
    at: str  # ISO 8601
    event_id: str | None = None

    def envelope(self) -> dict[str, Any]:
        """``.release`` as rules see it."""
        return {"by": self.by, "at": self.at}


# ---------------------------------------------------------------------------------------------------
# The gate's decision
# ---------------------------------------------------------------------------------------------------


def gate_decision(grant: Grant, envelope: Mapping[str, Any] | None) -> Decision | None:
    """The quarantine of a gated delivery that is neither trusted nor released; None when the rules decide.

    Read from the envelope routing.envelope built under this grant's gate: its switchboard-derived ``.actor``
    and ``.release``. A gated delivery without an envelope (or without ``.actor``) is held, never let through.
    """
    if grant.trusted_actors is None:
        return None
    env = envelope or {}
    if env.get("release") is not None:
        return None  # a person released it: the release is the decision
    actor = env.get("actor")
    if isinstance(actor, Mapping) and actor.get("trusted") is True:
        return None
    trace: dict[str, Any] = {
        "stage": TRUST_GATE_STAGE,
        "cause": UNTRUSTED_ACTOR,
        "actor": copy.deepcopy(dict(actor)) if isinstance(actor, Mapping) else None,
    }
    return Decision(disposition="quarantined", todos=[], trace=trace)


def quarantine_reason(trace: Mapping[str, Any] | None) -> QuarantineReason:
    """Why a quarantined event was held: the gate (untrusted_actor) or a quarantine action (rule_action)."""
    return UNTRUSTED_ACTOR if (trace or {}).get("stage") == TRUST_GATE_STAGE else RULE_ACTION
