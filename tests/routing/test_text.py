"""routing.text: the one rule for text PostgreSQL cannot store, and every boundary that applies it."""

from __future__ import annotations

import json

import pytest

from routing.collectors import BrokenCollectorConfig, collector_config, delivery_kind, stored_collector_config
from routing.envelope import build_envelope, parse_payload, parse_payload_checked, subject_key
from routing.headers import REDACTED, sanitize_headers
from routing.models import Fault
from routing.sources import producer_delivery_id
from routing.text import (
    MAX_DETAIL_CHARS,
    MAX_HEADER_NAME_CHARS,
    MAX_HEADER_VALUE_CHARS,
    MAX_HEADERS_TOTAL_CHARS,
    MAX_KIND_CHARS,
    REPLACEMENT,
    TRUNCATED,
    cap_bytes,
    cap_text,
    clean_json,
    clean_text,
    is_storable,
    replace_lone_surrogates,
    unstorable_field,
)
from routing.titles import todo_title

F = REPLACEMENT


def test_clean_text_replaces_each_nul_and_lone_surrogate() -> None:
    assert clean_text("a\x00b\ud800c\udfff") == f"a{F}b{F}c{F}"
    assert clean_text("smile \U0001f600") == "smile \U0001f600"  # a real astral character stays
    plain = "untouched"
    assert clean_text(plain) is plain
    assert not is_storable("\x00") and not is_storable("\udc00") and is_storable("\ufffd")


def test_caps_mark_the_cut_and_measure_after_cleaning() -> None:
    assert cap_text("abc", 3) == "abc"
    cut = cap_text("abcdef", 4)
    assert cut == "abc" + TRUNCATED and len(cut) == 4
    assert cap_text("\x00" * 10, 4) == F * 3 + TRUNCATED
    cut_bytes = cap_bytes("é" * 200, 256)
    assert len(cut_bytes.encode()) <= 256 and cut_bytes.endswith(TRUNCATED)
    assert cap_bytes("ok", 256) == "ok"


def test_clean_json_and_replace_lone_surrogates_walk_keys_and_values() -> None:
    value = {"k\x00": ["\ud800", {"x": "\x00"}], "n": 1, "b": True, "z": None}
    assert clean_json(value) == {f"k{F}": [F, {"x": F}], "n": 1, "b": True, "z": None}
    cleaned, changed = replace_lone_surrogates({"\udc00": ["ok", "\ud800"], "nul": "\x00"})
    assert changed and cleaned == {F: ["ok", F], "nul": "\x00"}  # NUL stays in .payload: it is valid JSON
    same, changed = replace_lone_surrogates({"a": "b"})
    assert not changed and same == {"a": "b"}


def test_unstorable_field_names_the_path_never_the_value() -> None:
    assert unstorable_field({"a": "ok", "b": {"c": [1, "x\x00"]}}) == "b.c[1]"
    assert unstorable_field({"rules": [{"action": {"queue": "\ud800"}}]}) == "rules[0].action.queue"
    assert unstorable_field({"a\x00": 1}) == "arguments (a key)"
    assert unstorable_field({"a": {"b\x00": 1}}) == "a (a key)"
    assert unstorable_field({"a": ["fine", 2, None]}) is None
    assert unstorable_field("\x00") == "value"


def test_payload_rule_lone_surrogates_become_fffd_and_the_body_is_flagged() -> None:
    body = b'{"title": "\\ud800 x", "pair": "\\ud83d\\ude00", "esc": "\\\\ud800"}'
    value, lossy = parse_payload_checked(body)
    assert lossy
    assert value == {"title": f"{F} x", "pair": "\U0001f600", "esc": "\\ud800"}
    assert parse_payload(body) == value
    # An escaped backslash followed by "ud800" is not a surrogate: nothing is replaced.
    assert parse_payload_checked(b'{"esc": "\\\\ud800"}') == ({"esc": "\\ud800"}, False)
    assert parse_payload_checked(b'{"nul": "\\u0000"}') == ({"nul": "\x00"}, False)
    # Raw surrogate bytes are not UTF-8: such a body is not JSON at all (kept raw, .payload null).
    assert parse_payload_checked(b'{"a": "\xed\xa0\x80"}') == (None, False)


def _issue_body(title: str, repo: str = "acme/app") -> bytes:
    return json.dumps(
        {
            "action": "opened",
            "issue": {"number": 3, "title": title, "state": "open", "user": {"login": "u\x00"}, "labels": []},
            "repository": {"full_name": repo},
        }
    ).encode()


def test_envelope_projections_carry_no_nul_or_surrogate_and_encode_as_utf8() -> None:
    env = build_envelope(
        source="github",
        webhook_id="wh_1",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={"x-github-event": "issues"},
        body=_issue_body("a\x00\ud800b"),
    )
    assert env["issue"]["title"] == f"a{F}{F}b" and env["issue"]["author"] == f"u{F}"
    assert env["payload"]["issue"]["title"] == f"a\x00{F}b"  # .payload: only surrogates are replaced
    json.dumps(env, ensure_ascii=False).encode("utf-8")  # the sandbox's wire format does not choke

    cairn = build_envelope(
        source="cairn",
        webhook_id="wh_1",
        trust_mode="signed",
        verified=True,
        content_type="application/json",
        headers={},
        body=json.dumps({"kind": "k\x00", "data": {"id": "a\x00", "metadata": {"m\x00": "\x00"}}}).encode(),
    )
    assert cairn["kind"] == f"k{F}"
    assert cairn["artifact"]["id"] == f"a{F}" and cairn["artifact"]["metadata"] == {f"m{F}": F}
    assert subject_key(cairn) == f"cairn:a{F}"


def test_overlong_subject_keys_are_dropped_not_cut() -> None:
    env = build_envelope(
        source="github",
        webhook_id="wh_1",
        trust_mode="signed",
        verified=True,
        content_type=None,
        headers={"x-github-event": "issues"},
        body=_issue_body("t", repo="r" * 300),
    )
    assert env["issue"]["key"] is None and subject_key(env) is None


def test_kind_is_cleaned_and_capped_for_every_source() -> None:
    assert delivery_kind("github", None, {"x-github-event": "a" * 9000}, None) == "a" * 255 + TRUNCATED
    assert len(delivery_kind("github", None, {"x-github-event": "a" * 9000}, None) or "") == MAX_KIND_CHARS
    assert delivery_kind("gitea", None, {"x-gitea-event": "is\x00sues"}, None) == f"is{F}sues"
    assert delivery_kind("cairn", None, {}, {"kind": "k" * 300}) == "k" * 255 + TRUNCATED
    config = {"collector": {"kind": {"mode": "header", "value": "X-Kind"}}}
    assert delivery_kind("generic", config, {"x-kind": "a\x00"}, None) == f"a{F}"
    ce = {"content-type": "application/cloudevents+json"}
    assert delivery_kind("generic", None, ce, {"type": "t\x00", "id": "1"}) == f"t{F}"


def test_delivery_ids_are_cleaned_before_the_byte_cap() -> None:
    assert producer_delivery_id("generic", {"x-delivery-id": "a\x00b"}, {}) == f"a{F}b"
    # 100 NULs are 300 bytes once replaced: over the cap, so the producer sent no usable id (the body hash keys it).
    assert producer_delivery_id("generic", {"x-delivery-id": "\x00" * 100}, {}) is None
    assert producer_delivery_id("cairn", {}, parse_payload(b'{"event_id": "e\\ud800"}')) == f"e{F}"
    assert producer_delivery_id("stripe", {}, parse_payload(b'{"id": "evt\\u0000"}')) == f"evt{F}"


def test_sanitize_headers_cleans_caps_and_bounds_and_still_redacts() -> None:
    long_name = "x-" + "n" * 400 + "-token"
    out = sanitize_headers(
        [("X-A", "v\x00"), ("X-Big", "b" * 20000), (long_name, "secret"), ("Referer", "https://h/?token=abc\x00")]
        + [(f"X-Fill-{i}", "f" * 8000) for i in range(10)]
    )
    assert out["x-a"] == f"v{F}"
    assert len(out["x-big"]) == MAX_HEADER_VALUE_CHARS and out["x-big"].endswith(TRUNCATED)
    [cut_name] = [k for k in out if k.startswith("x-nnn")]
    assert len(cut_name) == MAX_HEADER_NAME_CHARS and out[cut_name] == REDACTED  # decided on the full name
    assert out["referer"] == "https://h/?token=«redacted»"
    assert sum(len(k) + len(v) for k, v in out.items()) <= MAX_HEADERS_TOTAL_CHARS
    assert "x-fill-9" not in out


def test_titles_are_cleaned_and_capped_with_a_mark() -> None:
    assert todo_title("generic", None, {"title": "a\x00b"}) == f"generic: a{F}b"
    long = todo_title("generic", None, {"title": "t" * 1000})
    assert len(long) == 200 and long.endswith(TRUNCATED)


def test_fault_details_are_storable() -> None:
    fault = Fault(rule_index=0, rule_id="r\x00", cause="error", detail="jq: error: " + "\x00" * 2000)
    assert fault.rule_id == f"r{F}"
    assert fault.detail is not None and len(fault.detail) == MAX_DETAIL_CHARS and "\x00" not in fault.detail


@pytest.mark.parametrize(
    "stored",
    [
        {"collector": {"hmac": {"header": "bad header"}}},
        {"collector": {"kind": {"mode": "nope", "value": "x"}}},
        {"collector": {"extra": 1}},
        {"collector": "x"},
        {"collector": [1]},
    ],
)
def test_a_stored_collector_config_that_does_not_parse_is_broken_not_absent(stored: dict[str, object]) -> None:
    with pytest.raises(BrokenCollectorConfig):
        stored_collector_config(stored)
    # Kind and subject derivation (after the receiver refused the delivery anyway) read it as empty.
    assert collector_config(stored).hmac is None


def test_an_absent_collector_config_is_no_collector() -> None:
    assert stored_collector_config(None).hmac is None
    assert stored_collector_config({}).hmac is None
    assert stored_collector_config({"collector": None}).hmac is None
    assert stored_collector_config({"collector": {}}).hmac is None
