"""Structured logs: one JSON object per line, with the `extra=` fields (request id, status, …) included.

Every log record of the process, whichever logger made it (ours, uvicorn's access log, a library's
traceback), passes mask_secrets: ingest tokens in paths, credentials and signing secrets never reach a log.

The request id in force (``REQUEST_ID``: bound by the API for one request, by switchboard/request_ids.py for a
workflow run and its activities) is stamped on every record made while it is bound, so each line of a request,
of its workflow and of its activities carries it without anyone passing it along.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

MASKED_TOKEN = "«token»"  # noqa: S105  (the placeholder, not a secret)
MASKED = "«redacted»"

# An ingest path carries the only credential of a token-trust webhook; the route family is all a log needs.
_INGEST_PATH = re.compile(r"/webhooks/w/[^/\s?#\"'<>]+")
_CREDENTIALS = re.compile(r"\b(sbk|whsec|sba)_[0-9A-Za-z]+")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s\"',]+")
# GitHub's token formats (a reconciler's token, set_webhook_reconciler): classic, OAuth, user, app, refresh, and
# fine-grained personal access tokens.
_GITHUB_TOKENS = re.compile(r"\b(ghp|gho|ghu|ghs|ghr|github_pat)_[0-9A-Za-z_]+")

REQUEST_ID: ContextVar[str | None] = ContextVar("switchboard_request_id", default=None)
"""The request id the current request, workflow run or activity works for (None outside any)."""

# Where the record factory stamps the bound request id: a private attribute, so a caller's own
# `extra={"request_id": …}` never collides with it (LogRecord refuses to overwrite an attribute).
_RECORD_REQUEST_ID = "_request_id"

_known: set[str] = set()
_known_lock = threading.Lock()
_installed = False


def mask_secrets(text: str) -> str:
    """text with ingest tokens, credentials, signing secrets, bearer and GitHub tokens (and registered secrets)
    masked."""
    if "/webhooks/w/" in text:
        text = _INGEST_PATH.sub("/webhooks/w/" + MASKED_TOKEN, text)
    text = _CREDENTIALS.sub(lambda m: f"{m.group(1)}_{MASKED}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASKED}", text)
    text = _GITHUB_TOKENS.sub(lambda m: f"{m.group(1)}_{MASKED}", text)
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASKED)
    return text


def _mask_arg(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return mask_secrets(value)
    shown = str(value)
    masked = mask_secrets(shown)
    # Objects are kept (their %r or %d formatting intact) unless their text held something to mask.
    return value if masked == shown else masked


def _mask_record(record: logging.LogRecord) -> None:
    record.msg = mask_secrets(record.msg) if isinstance(record.msg, str) else _mask_arg(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(_mask_arg(a) for a in record.args)
    elif isinstance(record.args, dict):
        record.args = {k: _mask_arg(v) for k, v in record.args.items()}
    if record.exc_info and not record.exc_text:
        # Formatted now, masked once: every formatter (ours, pytest's, uvicorn's) prints exc_text when set.
        record.exc_text = mask_secrets(logging.Formatter().formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = mask_secrets(record.stack_info)


def install_masking(known_secrets: Iterable[str | None] = ()) -> None:
    """Mask every log record the process makes from now on; known_secrets (admin token, …) are masked verbatim.

    A record factory rather than a handler filter: it runs for every logger and every handler, including
    handlers someone else attaches (a test's capture, uvicorn's), so no code path can log around it.
    """
    global _installed
    with _known_lock:
        _known.update(s for s in known_secrets if s and len(s) >= 8)
        if _installed:
            return
        _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _mask_record(record)
        request_id = REQUEST_ID.get()
        if request_id is not None:
            setattr(record, _RECORD_REQUEST_ID, request_id)
        return record

    logging.setLogRecordFactory(factory)


# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: time, level, logger, message, extras, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        """One line of JSON; values that are not JSON become their repr-like string."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        bound = getattr(record, _RECORD_REQUEST_ID, None)
        if bound is not None:
            out["request_id"] = _mask_arg(bound)
        for key, value in vars(record).items():
            if key == "temporal_log":
                out.update(_core_fields(value))
            elif key not in _STANDARD and not key.startswith("_"):
                # `extra=` fields are set after the record factory ran, so they are masked here.
                out[key] = _mask_arg(value)
        if record.exc_info:
            out["exc"] = record.exc_text or mask_secrets(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = mask_secrets(self.formatStack(record.stack_info))
        return json.dumps(out, default=str, ensure_ascii=False)


def _core_fields(entry: Any) -> dict[str, Any]:
    """A forwarded Temporal core log entry's target and structured fields (switchboard/temporal_runtime.py forwards them)."""
    out: dict[str, Any] = {"core_target": getattr(entry, "target", None)}
    try:
        fields = entry.fields  # converted on every access: read once
    except Exception:  # a field that does not convert must not cost the line
        fields = None
    if isinstance(fields, dict) and fields:
        out["core_fields"] = {str(k): _mask_arg(v) for k, v in fields.items()}
    return out


def configure(level: str) -> None:
    """Send every log record to stderr as JSON lines at the given level, secrets masked."""
    install_masking()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
