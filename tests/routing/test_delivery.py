"""How a delivery rides in RouteDelivery's input: its exact bytes in base64, bounded by the ingest cap."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from routing.delivery import TEMPORAL_PAYLOAD_LIMIT, DeliveryInput, max_input_bytes, workflow_id_for
from routing.text import MAX_HEADERS_TOTAL_CHARS
from tests.helpers import delivery_input


def encoded(delivery: DeliveryInput) -> bytes:
    [payload] = asyncio.run(pydantic_data_converter.encode([delivery]))
    return payload.data


@pytest.mark.parametrize(
    "body",
    [
        b"\x01" * 4096,  # control characters: six bytes each as JSON text
        b'"' * 4096,  # quotes: two bytes each as JSON text
        b"\xff\xfe\x00binary",  # not UTF-8
        b'{"n": 7.50, "big": 1e999}',  # JSON whose value would not dump back to these bytes
        b"",
    ],
)
def test_any_body_comes_back_byte_for_byte_within_the_bound(body: bytes) -> None:
    delivery = delivery_input(body)
    data = encoded(delivery)
    back = DeliveryInput.model_validate_json(data)
    assert back.body == body and back == delivery
    assert len(data) <= max_input_bytes(len(body))


def test_the_worst_headers_and_a_full_body_fit_temporals_payload_limit() -> None:
    # Every stored header character a control character (six bytes once escaped), the body at the default cap.
    headers = {f"x-h{i}": "\x01" * 8000 for i in range(MAX_HEADERS_TOTAL_CHARS // 8000)}
    body = b"\x01" * (1024 * 1024)
    data = encoded(delivery_input(body, headers=headers))
    assert len(data) <= max_input_bytes(len(body)) <= TEMPORAL_PAYLOAD_LIMIT


def test_the_workflow_id_is_the_webhook_and_a_digest_of_the_delivery() -> None:
    assert workflow_id_for("wh_1", "wh_1:d1") == workflow_id_for("wh_1", "wh_1:d1")
    assert workflow_id_for("wh_1", "wh_1:d1").startswith("delivery-wh_1-")
    assert workflow_id_for("wh_1", "wh_1:d1") != workflow_id_for("wh_1", "wh_1:d2")
    assert delivery_input(external_id="wh_1:d9").workflow_id == workflow_id_for("wh_1", "wh_1:d9")
