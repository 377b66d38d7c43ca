"""Header lower-casing, joining and redaction before storage."""

from __future__ import annotations

import pytest

from routing.headers import REDACTED, lower_headers, sanitize_headers

LISTED = [
    "Authorization",
    "Proxy-Authorization",
    "Cookie",
    "Set-Cookie",
    "X-Hub-Signature",
    "X-Hub-Signature-256",
    "X-Gitea-Signature",
    "X-Gogs-Signature",
    "Stripe-Signature",
    "X-Slack-Signature",
    "X-Cairn-Signature",
    "X-Api-Key",
    "X-Webhook-Token",
]


@pytest.mark.parametrize("name", LISTED)
def test_listed_headers_are_redacted(name: str) -> None:
    out = sanitize_headers([(name, "s3cr3t-value")])
    assert out == {name.lower(): REDACTED}


@pytest.mark.parametrize(
    "name",
    [
        "X-Custom-Signature",
        "X-Refresh-Token",
        "X-Client-Secret",
        "X-My-Api-Key",
        "X-Vendor-ApiKey",
        "X-Auth-User",
        "X-OAuth-Thing",
    ],
)
def test_substring_rule_redacts(name: str) -> None:
    assert sanitize_headers([(name, "s3cr3t-value")]) == {name.lower(): REDACTED}


def test_plain_headers_kept_and_lowercased() -> None:
    out = sanitize_headers([("Content-Type", "application/json"), ("X-GitHub-Event", "push")])
    assert out == {"content-type": "application/json", "x-github-event": "push"}


def test_multi_valued_headers_joined_in_order() -> None:
    out = sanitize_headers([("Accept", "a/b"), ("ACCEPT", "c/d"), ("accept", "e/f")])
    assert out == {"accept": "a/b, c/d, e/f"}


def test_multi_valued_sensitive_header_fully_redacted() -> None:
    out = sanitize_headers([("Cookie", "a=1"), ("cookie", "b=2")])
    assert out == {"cookie": REDACTED}


@pytest.mark.parametrize("param", ["token", "access_token", "api_key", "secret", "signature", "sig"])
def test_query_parameter_redacted_inside_value(param: str) -> None:
    value = f"https://example.test/cb?x=1&{param}=abc123&y=2"
    out = sanitize_headers([("Referer", value)])
    assert out["referer"] == f"https://example.test/cb?x=1&{param}={REDACTED}&y=2"
    assert "abc123" not in out["referer"]


def test_query_parameter_redaction_case_insensitive_and_multiple() -> None:
    out = sanitize_headers([("Link", "<https://a.test/?TOKEN=aaa>; rel=next, <https://b.test/?sig=bbb>")])
    assert "aaa" not in out["link"] and "bbb" not in out["link"]
    assert out["link"] == f"<https://a.test/?TOKEN={REDACTED}>; rel=next, <https://b.test/?sig={REDACTED}>"


def test_query_redaction_does_not_touch_lookalike_names() -> None:
    out = sanitize_headers([("Referer", "https://a.test/?design=blue&nosig=1")])
    assert out["referer"] == "https://a.test/?design=blue&nosig=1"


def test_prefixed_secret_params_also_redacted() -> None:
    out = sanitize_headers([("Referer", "https://a.test/?refresh_token=rrr&client_secret=ccc")])
    assert "rrr" not in out["referer"] and "ccc" not in out["referer"]


def test_query_redaction_applies_after_join() -> None:
    out = sanitize_headers([("Via", "a?token=one"), ("via", "b?token=two")])
    assert out == {"via": f"a?token={REDACTED}, b?token={REDACTED}"}


def test_lower_headers_is_not_redacted() -> None:
    items = [("X-Hub-Signature-256", "sha256=ab"), ("Authorization", "Bearer x"), ("X-A", "1"), ("x-a", "2")]
    assert lower_headers(items) == {
        "x-hub-signature-256": "sha256=ab",
        "authorization": "Bearer x",
        "x-a": "1, 2",
    }


def test_empty_input() -> None:
    assert sanitize_headers([]) == {}
    assert lower_headers([]) == {}
