"""How a body rides in RouteDelivery's input: its JSON value when that gives back its exact bytes, else text or base64."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from routing.delivery import MAX_CARRIED_DEPTH, DeliveryInput, carried_body

VALUE = {"action": "opened", "issue": {"number": 7, "title": "Fix é ☃", "labels": [], "n": 1.5}, "ok": True}


def delivery(body: bytes, **fields: Any) -> DeliveryInput:
    return DeliveryInput(
        webhook_id="wh_1",
        endpoint_id="ep_1",
        source="github",
        kind="issues",
        external_id="wh_1:d1",
        trust_mode="signed",
        verified=True,
        verify_detail="ok",
        content_type="application/json",
        headers={"x-github-event": "issues"},
        source_ip=None,
        received_at="2026-12-01T00:00:00+00:00",
        **(fields or carried_body(body)),
    )


@pytest.mark.parametrize(
    ("body", "layout"),
    [
        (json.dumps(VALUE, separators=(",", ":"), ensure_ascii=False).encode(), "compact"),
        (json.dumps(VALUE).encode(), "spaced+ascii"),
        (json.dumps(VALUE, indent=2, ensure_ascii=False).encode() + b"\n", "indent2+lf"),
        (json.dumps(VALUE, indent=4).encode(), "indent4+ascii"),
        (json.dumps([1, 2, {"a": None}]).encode(), "spaced+ascii"),
    ],
)
def test_a_json_body_travels_as_its_value_and_comes_back_byte_for_byte(body: bytes, layout: str) -> None:
    d = delivery(body)
    assert d.body_layout == layout and d.body_text is None and d.body_b64 is None
    # Through Temporal's JSON and back: the same bytes, the same envelope as from the raw bytes.
    again = DeliveryInput.model_validate_json(d.model_dump_json())
    assert again.body() == body and again.size() == len(body)
    raw = delivery(body, body_text=body.decode())
    assert again.envelope() == raw.envelope()


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": 7.50}',  # a number a dump writes otherwise
        b'{"a": 1, "a": 2}',  # a duplicate key
        b'{"a":1, "b":2}',  # mixed separators
        b'{"s": "\\u00e9", "t": "\xc3\xa9"}',  # escaped and raw non-ASCII together
        b'{"lone": "\\ud800"}',  # a lone surrogate (the envelope replaces it; the bytes must stay)
        b'{"big": 123456789012345678901234567890}',  # wider than int64
        b"action=opened&number=7",
        b'"just a string"',
        b"",
    ],
)
def test_other_utf8_bodies_travel_as_text(body: bytes) -> None:
    d = delivery(body)
    assert d.body_text == body.decode() and d.body_layout is None
    assert DeliveryInput.model_validate_json(d.model_dump_json()).body() == body


def test_a_body_nested_deeper_than_the_converter_allows_travels_as_text() -> None:
    deep = ("[" * (MAX_CARRIED_DEPTH + 1) + "]" * (MAX_CARRIED_DEPTH + 1)).encode()
    assert delivery(deep).body_text is not None
    shallow = ("[" * MAX_CARRIED_DEPTH + "]" * MAX_CARRIED_DEPTH).encode()
    assert delivery(shallow).body_layout is not None


def test_a_body_that_is_not_utf8_travels_as_base64_as_every_older_input_did() -> None:
    body = b"\xff\xfe\x00binary"
    d = delivery(body)
    assert d.body_b64 is not None and d.body() == body and d.size() == len(body)
    old = DeliveryInput.model_validate_json(json.dumps({**json.loads(d.model_dump_json()), "body_text": None}))
    assert old.body() == body


def test_exactly_one_form_and_a_value_that_does_not_give_back_its_size_is_refused() -> None:
    with pytest.raises(ValidationError, match="exactly one"):
        delivery(b"", body_text="a", body_b64="YQ==")
    with pytest.raises(ValidationError, match="exactly one"):
        delivery(b"", body_layout=None)
    with pytest.raises(ValidationError, match="known body_layout"):
        delivery(b"", body_json={"a": 1}, body_layout="yaml", body_size=8)
    altered = delivery(b"", body_json={"a": 12}, body_layout="compact", body_size=7)
    with pytest.raises(ValueError, match="does not give back the body's 7 bytes"):
        altered.body()


def test_the_delivery_id_reads_a_carried_value_like_the_body_it_was_parsed_from() -> None:
    from routing.sources import delivery_id

    body = json.dumps({"id": "evt_1", "type": "invoice.paid"}).encode()
    d = delivery(body)
    headers: dict[str, str] = {}
    assert delivery_id("stripe", headers, body, d.body_json) == delivery_id("stripe", headers, body) == "evt_1"
    # A value that is not an object has no fields: the content-addressed id, as for the body itself.
    assert delivery_id("stripe", headers, b"[1]", [1]) == delivery_id("stripe", headers, b"[1]")
