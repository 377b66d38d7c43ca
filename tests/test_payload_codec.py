"""The payload codec: AES-256-GCM over whole payloads, key ids for rotation, and failing closed."""

from __future__ import annotations

import secrets

import pytest
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload

from switchboard.payload_codec import ENCODING, KEY_ID, AESGCMCodec, PayloadKeyError, key_id, payload_codec
from switchboard.settings import Settings

PLAIN = Payload(metadata={"encoding": b"json/plain"}, data=b'{"body_json": {"secret": "s3cr3t"}}')


def _key() -> bytes:
    return secrets.token_bytes(32)


async def test_a_sealed_payload_hides_its_content_and_opens_to_the_same_payload() -> None:
    key = _key()
    codec = AESGCMCodec(key)
    [sealed] = await codec.encode([PLAIN])
    assert sealed.metadata["encoding"] == ENCODING and sealed.metadata[KEY_ID] == key_id(key).encode()
    assert b"s3cr3t" not in sealed.SerializeToString() and b"json/plain" not in sealed.SerializeToString()
    assert key.hex() not in sealed.metadata[KEY_ID].decode()
    # A fresh nonce per seal: the same payload never seals to the same bytes.
    [again] = await codec.encode([PLAIN])
    assert again.data != sealed.data
    assert await codec.decode([sealed, again]) == [PLAIN, PLAIN]


async def test_old_keys_open_what_they_sealed_and_only_the_current_key_seals() -> None:
    old, new = _key(), _key()
    [by_old] = await AESGCMCodec(old).encode([PLAIN])
    rotated = AESGCMCodec(new, [old])
    assert await rotated.decode([by_old]) == [PLAIN]
    [by_new] = await rotated.encode([PLAIN])
    assert by_new.metadata[KEY_ID] == key_id(new).encode()


async def test_a_payload_under_an_unknown_key_fails_closed_naming_the_key_id() -> None:
    stranger = _key()
    [sealed] = await AESGCMCodec(stranger).encode([PLAIN])
    with pytest.raises(PayloadKeyError, match=f"key id {key_id(stranger)}.*SWITCHBOARD_PAYLOAD_OLD_KEYS"):
        await AESGCMCodec(_key()).decode([sealed])


async def test_a_tampered_payload_or_a_swapped_key_id_fails_closed() -> None:
    key, other = _key(), _key()
    codec = AESGCMCodec(key, [other])
    [sealed] = await codec.encode([PLAIN])
    flipped = bytearray(sealed.data)
    flipped[-1] ^= 1
    tampered = Payload(metadata=dict(sealed.metadata), data=bytes(flipped))
    with pytest.raises(PayloadKeyError, match="does not authenticate"):
        await codec.decode([tampered])
    # The key id is the associated data: relabelling a payload as another known key's does not open it.
    relabelled = Payload(metadata={**sealed.metadata, KEY_ID: key_id(other).encode()}, data=sealed.data)
    with pytest.raises(PayloadKeyError, match="does not authenticate"):
        await codec.decode([relabelled])
    with pytest.raises(PayloadKeyError):
        await codec.decode([Payload(metadata={"encoding": ENCODING}, data=sealed.data)])


async def test_a_payload_written_before_the_key_was_set_passes_through() -> None:
    assert await AESGCMCodec(_key()).decode([PLAIN]) == [PLAIN]


def test_settings_refuse_a_malformed_key_and_old_keys_without_a_current_one() -> None:
    assert payload_codec(None) is None
    assert payload_codec(_key().hex(), f"{_key().hex()}, {_key().hex()}") is not None
    with pytest.raises(ValidationError, match="SWITCHBOARD_PAYLOAD_KEY must be 64 hex"):
        Settings(payload_key="not-hex")
    with pytest.raises(ValidationError, match="SWITCHBOARD_PAYLOAD_OLD_KEYS must be 64 hex"):
        Settings(payload_key=_key().hex(), payload_old_keys="abcd")
    with pytest.raises(ValidationError, match="without SWITCHBOARD_PAYLOAD_KEY"):
        Settings(payload_old_keys=_key().hex())
