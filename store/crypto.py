"""Secrets at rest: AES-256-GCM under the server key, with the webhook id as associated data.

The database records which key seals its secrets (a fingerprint, never the key): a process started with another
key refuses to start (`check_secret_key`), rather than starting and refusing every signed delivery with 503.
"""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from store.db import Pool
from store.errors import translates_errors

_VERSION = b"\x01"


class SecretBox:
    """Encrypts webhook signing secrets; a row copied to another webhook will not decrypt."""

    def __init__(self, key_hex: str) -> None:
        key = bytes.fromhex(key_hex)
        if len(key) != 32:
            raise ValueError("SWITCHBOARD_SECRET_KEY must be 64 hex characters (32 bytes)")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"switchboard secret key\x00" + key).hexdigest()[:16]
        """The key's fingerprint: names it without revealing it."""

    def seal(self, plaintext: str, context: str) -> bytes:
        """Encrypt plaintext bound to context."""
        nonce = os.urandom(12)
        return _VERSION + nonce + self._aead.encrypt(nonce, plaintext.encode(), context.encode())

    def open(self, sealed: bytes, context: str) -> str:
        """Decrypt what seal produced for the same context."""
        if sealed[:1] != _VERSION:
            raise ValueError("unknown secret format")
        nonce, body = sealed[1:13], sealed[13:]
        return self._aead.decrypt(nonce, body, context.encode()).decode()


class SecretKeyMismatch(Exception):
    """The database's secrets are sealed under another SWITCHBOARD_SECRET_KEY: the process must not start.

    Not a DomainError: it never answers a request; it stops a process before it serves any.
    """

    code = "secret_key_mismatch"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@translates_errors
async def _recorded_key(pool: Pool, key_id: str) -> tuple[str, datetime]:
    """The database's key fingerprint and when it was recorded; key_id becomes it when none is recorded yet."""
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO secret_key_check (key_id) VALUES (%s) ON CONFLICT (singleton) DO NOTHING", (key_id,)
        )
        row = await (await conn.execute("SELECT key_id, recorded_at FROM secret_key_check")).fetchone()
    assert row is not None
    return str(row["key_id"]), row["recorded_at"]


async def check_secret_key(pool: Pool, box: SecretBox) -> None:
    """Record box's key as the database's on first start; raise SecretKeyMismatch when another key is recorded."""
    recorded, at = await _recorded_key(pool, box.key_id)
    if recorded != box.key_id:
        raise SecretKeyMismatch(
            f"SWITCHBOARD_SECRET_KEY (fingerprint {box.key_id}) is not the key this database's secrets are sealed"
            f" with (fingerprint {recorded}, recorded {at.astimezone(UTC):%Y-%m-%d %H:%M} UTC); with it every"
            " stored webhook secret would fail to decrypt and every signed delivery would get 503. Start with the"
            " original key (your secret store, the compose .env file, or the data folder's secret_key)"
        )
