"""The optional payload codec: every Temporal payload sealed with AES-256-GCM under SWITCHBOARD_PAYLOAD_KEY.

Each sealed payload names its key by a key id (a digest of the key, never the key) in its metadata, so keys
rotate: the current key seals, and it or any of SWITCHBOARD_PAYLOAD_OLD_KEYS opens what they sealed. The key
id is also the associated data, so a payload cannot be passed off as sealed under another key. Decoding fails
closed with PayloadKeyError (a workflow task then fails and retries, visible in the UI, until a worker has the
key); a payload that was never sealed (written before the key was set) passes through unchanged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
_NONCE = 12


class PayloadKeyError(ValueError):
    """A sealed payload that this process cannot open: no such key, or it does not authenticate."""


def parse_key(value: str, setting: str) -> bytes:
    """A 64-hex-character key (32 bytes); anything else raises ValueError naming the setting."""
    try:
        key = bytes.fromhex(value.strip())
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"{setting} must be 64 hex characters (32 bytes)")
    return key


def key_id(key: bytes) -> str:
    """The id a sealed payload names its key by: a digest of the key, which does not reveal it."""
    return hashlib.sha256(b"switchboard payload key\x00" + key).hexdigest()[:16]


class AESGCMCodec(PayloadCodec):
    """Seals payloads under the current key; opens those of the current and the old keys."""

    def __init__(self, current: bytes, old: Sequence[bytes] = ()) -> None:
        self.key_id = key_id(current)
        self._seal_with = AESGCM(current)
        self._keys = {key_id(k): AESGCM(k) for k in (*old, current)}

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Seal each payload (its whole protobuf: metadata and data) under the current key."""
        return [self.seal(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Open each sealed payload; raise PayloadKeyError for one that does not open."""
        return [self.open(p) for p in payloads]

    def seal(self, payload: Payload) -> Payload:
        """One payload, sealed."""
        nonce = os.urandom(_NONCE)
        kid = self.key_id.encode()
        sealed = self._seal_with.encrypt(nonce, payload.SerializeToString(), kid)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: kid}, data=nonce + sealed)

    def open(self, payload: Payload) -> Payload:
        """One payload, opened (unchanged when it was never sealed)."""
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        kid = payload.metadata.get(KEY_ID, b"").decode("ascii", "replace")
        aead = self._keys.get(kid)
        if aead is None:
            raise PayloadKeyError(
                f"payload sealed under key id {kid or '(none)'}: not SWITCHBOARD_PAYLOAD_KEY"
                " nor one of SWITCHBOARD_PAYLOAD_OLD_KEYS"
            )
        try:
            plain = aead.decrypt(payload.data[:_NONCE], payload.data[_NONCE:], kid.encode())
        except InvalidTag:
            raise PayloadKeyError(f"payload sealed under key id {kid} does not authenticate (altered)") from None
        return Payload.FromString(plain)


def payload_codec(current: str | None, old: str = "") -> AESGCMCodec | None:
    """The codec for SWITCHBOARD_PAYLOAD_KEY and _OLD_KEYS (comma-separated), or None when no key is set."""
    if not current:
        if old.strip():
            raise ValueError("SWITCHBOARD_PAYLOAD_OLD_KEYS is set without SWITCHBOARD_PAYLOAD_KEY")
        return None
    olds = [parse_key(k, "SWITCHBOARD_PAYLOAD_OLD_KEYS") for k in old.split(",") if k.strip()]
    return AESGCMCodec(parse_key(current, "SWITCHBOARD_PAYLOAD_KEY"), olds)
