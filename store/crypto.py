"""Secrets at rest: AES-256-GCM under the server key, with the webhook id as associated data."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_VERSION = b"\x01"


class SecretBox:
    """Encrypts webhook signing secrets; a row copied to another webhook will not decrypt."""

    def __init__(self, key_hex: str) -> None:
        key = bytes.fromhex(key_hex)
        if len(key) != 32:
            raise ValueError("SWITCHBOARD_SECRET_KEY must be 64 hex characters (32 bytes)")
        self._aead = AESGCM(key)

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
