"""Opaque, prefixed identifiers and credentials."""

from __future__ import annotations

import hashlib
import secrets


def new_id(prefix: str) -> str:
    """A fresh id such as ``td_3f9c…`` (96 random bits)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def new_credential() -> str:
    """An endpoint bearer credential: ``sbk_`` + 64 hex chars."""
    return "sbk_" + secrets.token_hex(32)


def credential_hash(credential: str) -> bytes:
    """What the database stores instead of the credential."""
    return hashlib.sha256(credential.encode()).digest()


def new_ingest_token() -> str:
    """16 random bytes as 32 hex chars; routes a delivery, and is the credential for token-trust sources."""
    return secrets.token_hex(16)


def new_webhook_secret() -> str:
    """A signing secret for signed source types."""
    return "whsec_" + secrets.token_hex(32)
