"""The authoring filter language (routing/filters/): its jq, run by the rule engine, agrees with its Python reading."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from routing import jq_policy
from routing.filters import grounding, language, to_jq
from routing.filters.language import (
    AllOf,
    AnyOf,
    Condition,
    Drop,
    Eq,
    Exists,
    FilterAnswer,
    FilterError,
    In,
    Not,
    QueueTo,
    ScheduleAnswer,
    Unsupported,
)
from tests.routing import filter_oracle
from tests.routing.in_process import check_in_process, evaluate_in_process

# Keys that need quoting in jq, or that look like jq code, variables or interpolations when spliced.
KEYS = [
    "a",
    "b",
    "kind",
    "x-y",
    'q"uote',
    "back\\slash",
    "\\(1)",
    "dot.ted",
    "ünï",
    "sp ace",
    "$__loc__",
    "",
    "0",
    "env",
]
TEXTS = ["", "bug", "Bug", 'a"b', "\\", "\\(.)", "ünïcode", "line\nbreak", "1", "true", "null", "😀"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-language.SAFE_INT, max_value=language.SAFE_INT),
    st.sampled_from(TEXTS),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=8),
)
json_scalars = st.one_of(scalars, st.sampled_from([0.0, 1.0, -2.5, 3.25]))
documents = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=20,
)
random_paths = st.lists(st.sampled_from(KEYS), min_size=1, max_size=4).map(language.render_path)
envelopes = st.fixed_dictionaries(
    {
        "source": st.just("github"),
        "kind": st.none() | st.sampled_from(["issues", "push", "ping", 'we"ird']),
        "payload": documents,
        "headers": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(TEXTS), max_size=3),
    }
)


def answers_for(envelope: dict[str, Any]) -> st.SearchStrategy[FilterAnswer]:
    """Filters over an envelope's own paths and values (so conditions hit), mixed with random ones."""
    grounded = grounding.ground([envelope], values=True)
    found = [g.path for g in grounded]
    seen = [v for g in grounded for v in g.values or [] if not isinstance(v, float)]
    paths = st.sampled_from(found) | random_paths if found else random_paths
    values = st.sampled_from(seen) | scalars if seen else scalars

    def leaf() -> st.SearchStrategy[Condition]:
        return st.one_of(
            st.builds(Eq, op=st.just("eq"), path=paths, value=values),
            st.builds(In, op=st.just("in"), path=paths, values=st.lists(values, min_size=1, max_size=4)),
            st.builds(Exists, op=st.just("exists"), path=paths),
        )

    conditions: st.SearchStrategy[Condition] = st.recursive(
        leaf(),
        lambda inner: st.one_of(
            st.builds(AllOf, op=st.just("all"), of=st.lists(inner, min_size=1, max_size=3)),
            st.builds(AnyOf, op=st.just("any"), of=st.lists(inner, min_size=1, max_size=3)),
            st.builds(Not, op=st.just("not"), of=inner),
        ),
        max_leaves=6,
    )
    return st.builds(
        FilterAnswer,
        type=st.just("filter"),
        kinds=st.lists(st.sampled_from(["issues", "push", "ping", 'we"ird']), max_size=2),
        where=st.none() | conditions,
        action=st.just(QueueTo(queue="work")),
    )


answers = envelopes.flatmap(answers_for)


def _engine_matches(expr: str, envelope: dict[str, Any]) -> bool:
    evaluation = evaluate_in_process(
        [{"id": "r", "expr": expr, "action": {"queue": "work"}}], None, envelope, rule_timeout=5, event_budget=5
    )
    assert evaluation.faults == [], evaluation.faults
    return evaluation.matched_index == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), envelope=envelopes)
def test_compiled_jq_agrees_with_the_python_reading(data: st.DataObject, envelope: dict[str, Any]) -> None:
    answer = data.draw(answers_for(envelope))
    expr = to_jq.to_jq(answer)
    assert jq_policy.verdict(expr) is None
    matched = filter_oracle.matches(answer, envelope)
    assert _engine_matches(expr, envelope) == matched
    # Both outcomes must occur, or the agreement says little.
    event(f"matched={matched}")


@settings(max_examples=100, deadline=None)
@given(answer=answers)
def test_compiled_jq_compiles_and_is_deterministic(answer: FilterAnswer) -> None:
    expr = to_jq.to_jq(answer)
    assert check_in_process([expr]) == [None]
    assert to_jq.to_jq(FilterAnswer.model_validate(answer.model_dump())) == expr


@given(segments=st.lists(st.text(st.characters(exclude_categories=["Cs"]), max_size=6), min_size=1, max_size=6))
def test_paths_round_trip_through_their_text(segments: list[str]) -> None:
    text = language.render_path(segments)
    assert language.parse_path(text) == tuple(segments)


def test_path_text_forms() -> None:
    assert language.render_path(["payload", "issue", "x-y", "a b"]) == '.payload.issue["x-y"]["a b"]'
    assert language.parse_path("payload.action") == ("payload", "action")
    assert language.parse_path('.headers.["x-github-event"]') == ("headers", "x-github-event")
    for bad in (".", ".a.", ".a[1]", '.a["x"', ".a b", ".1a"):
        with pytest.raises(FilterError):
            language.parse_path(bad)


def test_labels_membership_reads_through_arrays() -> None:
    envelope = {
        "kind": "issues",
        "payload": {"action": "opened", "issue": {"labels": [{"name": "bug"}, {"name": "p1"}]}, "tags": ["x", "y"]},
    }
    bug = FilterAnswer(
        type="filter",
        kinds=["issues"],
        where=AllOf(
            op="all",
            of=[
                Eq(op="eq", path=".payload.action", value="opened"),
                In(op="in", path=".payload.issue.labels.name", values=["bug", "security"]),
                Eq(op="eq", path=".payload.tags", value="y"),
            ],
        ),
        action=QueueTo(queue="work"),
    )
    assert filter_oracle.matches(bug, envelope) and _engine_matches(to_jq.to_jq(bug), envelope)
    other_kind = bug.model_copy(update={"kinds": ["push"]})
    assert not filter_oracle.matches(other_kind, envelope) and not _engine_matches(to_jq.to_jq(other_kind), envelope)
    # true is not 1, and a missing path reaches nothing (not even null).
    one = FilterAnswer(
        type="filter", kinds=[], where=Eq(op="eq", path=".payload.flag", value=1), action=Drop(drop=True)
    )
    assert not filter_oracle.matches(one, {"payload": {"flag": True}})
    missing = one.model_copy(update={"where": Eq(op="eq", path=".payload.none", value=None)})
    assert not filter_oracle.matches(missing, {"payload": {}}) and not _engine_matches(
        to_jq.to_jq(missing), {"payload": {}}
    )
    assert to_jq.to_jq(FilterAnswer(type="filter", kinds=[], where=None, action=Drop(drop=True))) == "true"


def test_parse_reply_reads_each_answer_and_names_problems() -> None:
    assert isinstance(
        language.parse_reply({"answer": {"type": "schedule", "cron": "0 9 * * 1-5", "timezone": "UTC"}}), ScheduleAnswer
    )
    assert isinstance(language.parse_reply({"answer": {"type": "unsupported", "reason": "fuzzy"}}), Unsupported)
    garbage: Any
    for garbage in (
        None,
        "billing",
        {"queue": "billing", "confidence": 0.9},
        {"answer": {"type": "filter", "kinds": [], "where": {"op": "eq", "path": ".a"}, "action": {"queue": "w"}}},
        {"answer": {"type": "filter", "kinds": [], "where": None, "action": {"queue": "w", "endpoints": ["e"]}}},
        {
            "answer": {
                "type": "filter",
                "kinds": [],
                "where": {"op": "eq", "path": ".a", "value": 1.5},
                "action": {"drop": True},
            }
        },
        {
            "answer": {
                "type": "filter",
                "kinds": [],
                "where": {"op": "eq", "path": ".a", "value": 2**60},
                "action": {"drop": True},
            }
        },
    ):
        with pytest.raises(FilterError, match="does not fit the filter schema"):
            language.parse_reply(garbage)
    deep: dict[str, Any] = {"op": "exists", "path": ".a"}
    for _ in range(language.MAX_DEPTH):
        deep = {"op": "not", "of": deep}
    with pytest.raises(FilterError, match="nests deeper"):
        language.parse_reply({"answer": {"type": "filter", "kinds": [], "where": deep, "action": {"drop": True}}})


def test_ungrounded_paths_are_named_in_canonical_comparison() -> None:
    answer = FilterAnswer(
        type="filter",
        kinds=[],
        where=AnyOf(
            op="any",
            of=[
                Eq(op="eq", path="payload.action", value="opened"),
                Exists(op="exists", path=".payload.secret_field"),
                Exists(op="exists", path="..bad"),
            ],
        ),
        action=Drop(drop=True),
    )
    assert language.ungrounded(answer, {".payload.action"}) == [".payload.secret_field", "..bad"]


def test_grounding_lists_paths_and_withholds_producer_values_unless_allowed() -> None:
    envelope = {
        "source": "github",
        "kind": "issues",
        "webhook_id": "wh_1",
        "headers": {"x-github-event": "issues"},
        "payload": {
            "action": "opened",
            "issue": {"labels": [{"name": "bug"}], "html_url": "https://x"},
            "body": "z" * 500,
        },
    }
    withheld = {g.path: g.values for g in grounding.ground([envelope], values=False)}
    assert ".webhook_id" not in withheld
    assert withheld[".kind"] == ["issues"] and withheld[".source"] == ["github"]
    assert withheld[".payload.action"] is None and withheld['.headers["x-github-event"]'] is None
    assert ".payload.issue.labels.name" in withheld
    shown = {g.path: g.values for g in grounding.ground([envelope], values=True)}
    assert shown[".payload.action"] == ["opened"] and shown[".payload.issue.labels.name"] == ["bug"]
    assert shown[".payload.body"] == []  # a long string is never cut into a value no event has
    ordered = [g.path for g in grounding.ground([envelope], values=False)]
    assert ordered.index(".payload.issue.html_url") > ordered.index(".payload.issue.labels")


def test_response_schema_enumerates_paths_and_queues() -> None:
    schema = grounding.response_schema([".payload.action"], ["work", "triage"])
    text = json.dumps(schema)
    assert "oneOf" not in text and "discriminator" not in text
    assert schema["$defs"]["Eq"]["properties"]["path"]["enum"] == [".payload.action"]
    assert schema["$defs"]["QueueTo"]["properties"]["queue"]["enum"] == ["work", "triage"]
    empty = grounding.response_schema([], ["work"])
    assert empty["$defs"]["FilterAnswer"]["properties"]["where"] == {"type": "null"} and "Eq" not in empty["$defs"]
