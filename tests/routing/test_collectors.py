"""Pure collector derivations: paths, kind fallback order, CloudEvents attributes, coalescing subjects."""

from __future__ import annotations

import pytest

from routing.collectors import CollectorConfig, cloudevent, derive_generic_kind, lookup, parse_path, path_subject
from routing.decision import decide
from routing.models import Evaluation, Grant, Target


def test_simple_dotted_paths() -> None:
    assert parse_path(".data.items.0.type") == ["data", "items", "0", "type"]
    assert lookup({"data": {"items": [{"type": "x"}]}}, "data.items.0.type") == "x"
    assert lookup({"data": [1]}, "data.5") is None and lookup("text", "a") is None
    for bad in ("", "a..b", "a[0]", ".a | b", "a.*", ".".join("a" * 17)):
        with pytest.raises(ValueError):
            parse_path(bad)


def test_kind_order_configured_then_cloudevents_then_default_then_forge() -> None:
    by_path = CollectorConfig.model_validate({"kind": {"mode": "json_path", "value": "ev", "default": "d"}})
    ce = {"ce-type": "com.x", "ce-id": "1"}
    assert derive_generic_kind(by_path, ce, {"ev": "mine"}) == "mine"
    assert derive_generic_kind(by_path, ce, {}) == "com.x"
    assert derive_generic_kind(by_path, {}, {"ev": 7}) == "7"
    assert derive_generic_kind(by_path, {}, {"ev": True}, forge_kind="push") == "d"
    fixed = CollectorConfig.model_validate({"kind": {"mode": "fixed", "value": "f"}})
    assert derive_generic_kind(fixed, {}, None, forge_kind="push") == "f"
    assert derive_generic_kind(CollectorConfig(), {}, None, forge_kind="push") == "push"


def test_cloudevent_modes() -> None:
    structured = {"content-type": "application/cloudevents+json; charset=utf-8"}
    body = {"id": "a", "source": "/s", "type": "t", "specversion": "1.0"}
    assert cloudevent(structured, body) == {"mode": "structured", "id": "a", "source": "/s", "type": "t"}
    assert cloudevent({"ce-id": "b", "ce-type": "t2"}, None) == {
        "mode": "binary",
        "id": "b",
        "source": None,
        "type": "t2",
    }
    assert cloudevent({"content-type": "application/json"}, body) is None


def _grant(default: dict[str, object], subject_path: str | None = None) -> Grant:
    return Grant(
        webhook_id="wh_1",
        owner_endpoint_id="ep_1",
        human_id="hu_1",
        source="generic",
        target_queue="work",
        allowed_queues=["work"],
        targets=[Target(endpoint_id="ep_1", scope_queues=["work"])],
        default_action=default,
        subject_path=subject_path,
    )


def test_decision_carries_the_coalescing_subject() -> None:
    env = {"source": "generic", "payload": {"ticket": {"id": 9}}, "issue": None, "artifact": None}
    assert path_subject(env, "ticket.id", "wh_1") == "generic:wh_1:9"
    d = decide(_grant({"queue": "work", "coalesce": True}, "ticket.id"), Evaluation(), env)
    assert d.coalesce is True and d.subject_key == "generic:wh_1:9" and d.trace["subject_key"] == "generic:wh_1:9"
    # No subject: an ordinary delivery. No flag: no subject recorded.
    assert decide(_grant({"queue": "work", "coalesce": True}), Evaluation(), env).coalesce is False
    plain = decide(_grant({"queue": "work"}, "ticket.id"), Evaluation(), env)
    assert plain.coalesce is False and plain.subject_key is None and "subject_key" not in plain.trace
