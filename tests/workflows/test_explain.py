"""The Temporal UI explains a delivery: summary line, details, activity summaries, search by the producer's id."""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.contrib.pydantic import pydantic_data_converter

from routing.delivery import MAX_SUMMARY_CHARS, CommitResult, TodoRef, start_details, summary_line
from tests.conftest import Stack
from tests.helpers import delivery_input, issue_payload, post_github
from workflows import explain, search


def _summary(payload: Any, source: str = "github", kind: str | None = "issues") -> str:
    return summary_line(source, kind, payload)


def test_summary_names_source_kind_action_and_subject() -> None:
    assert _summary(issue_payload(number=12)) == "github issues opened acme/app#12"
    cairn = {"kind": "artifact.shared", "data": {"id": "art_9"}}
    assert _summary(cairn, source="cairn", kind="artifact.shared") == "cairn artifact.shared cairn:art_9"


def test_summary_of_a_pull_request_and_of_a_body_that_is_not_json() -> None:
    pr = {"action": "closed", "pull_request": {"number": 3}, "repository": {"full_name": "acme/app"}}
    assert _summary(pr, kind="pull_request") == "github pull_request closed acme/app#3"
    assert _summary(None, kind=None) == "github"


def test_producer_text_cannot_put_links_or_lines_into_the_ui() -> None:
    hostile = issue_payload(action="opened\n# [click](https://evil.example)<img>")
    line = _summary(hostile)
    assert "\n" not in line and "](" not in line and "<img>" not in line
    assert line.startswith("github issues opened # \\[click\\]\\(")
    assert len(_summary(issue_payload(action="x" * 5000))) <= 2 * MAX_SUMMARY_CHARS


def test_start_details_say_where_the_delivery_came_from() -> None:
    details = start_details(delivery_input(b'{"a": 1}', webhook_id="wh_x", external_id="wh_x:d-1"))
    assert "`wh_x`" in details and "`wh_x:d-1`" in details and "verified yes" in details and "8 bytes" in details


def test_end_details_name_decision_rule_event_todos_and_faults() -> None:
    result = CommitResult(
        event_id="ev_1",
        rule_id="issues",
        created=1,
        todos=[TodoRef(id="td_1", endpoint_id="ep_x", queue="work", created=True)],
    )
    faults = [{"rule_index": 0, "rule_id": "bad", "cause": "error", "detail": "jq: [boom](x)"}]
    text = explain.end_details(result, faults)
    assert "**decision** routed" in text and "`issues`" in text and "`ev_1`" in text
    assert "`td_1` work @ `ep_x`" in text
    assert "bad: error — jq: \\[boom\\]\\(x\\)" in text
    assert "**decision** gone" in explain.end_details(CommitResult(status="gone"))


async def test_a_delivery_is_found_by_its_producer_id_and_explains_itself(stack: Stack) -> None:
    agent = await stack.agent()
    rule = {"id": "issues", "expr": '.kind == "issues"', "action": {"queue": "work"}}
    hook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    await agent.ok("set_webhook_rules", {"webhook_id": hook["webhook_id"], "rules": [rule]})
    producer_id = f"gh-{uuid.uuid4()}"
    resp = await post_github(stack.http, hook, issue_payload(number=12), delivery=producer_id)
    assert resp.status_code == 202, resp.text
    event_id = resp.json()["event_id"]

    query = f'{search.DELIVERY_ID.name} = "{producer_id}"'
    found = [wf async for wf in stack.temporal.list_workflows(query)]
    assert len(found) == 1
    handle = stack.temporal.get_workflow_handle(found[0].id, run_id=found[0].run_id)
    desc = await handle.describe()
    assert await desc.static_summary() == "github issues opened acme/app#12"
    details = await desc.static_details()
    assert details is not None and "`wh_" in details and "verified yes" in details
    attrs = {key.name: value for key, value in desc.typed_search_attributes}
    assert attrs[search.EVENT_ID.name] == event_id
    # The event's id finds the same run.
    by_event = [wf async for wf in stack.temporal.list_workflows(f'{search.EVENT_ID.name} = "{event_id}"')]
    assert [wf.run_id for wf in by_event] == [found[0].run_id]

    # Current details, as the UI asks for them (the workflow metadata query): the decision and its todo.
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    current = metadata.current_details
    assert "**decision** routed" in current and "`issues`" in current and event_id in current

    # Activity summaries: each activity the run scheduled says what it worked on.
    history = await handle.fetch_history()
    converter = pydantic_data_converter.payload_converter
    summaries = [
        converter.from_payload(e.user_metadata.summary, str)
        for e in history.events
        if e.HasField("user_metadata") and e.user_metadata.HasField("summary")
    ]
    # The rules on the default path, evaluated on the idle worker's own free child (the fast path).
    assert "1 rule on this worker, if a sandbox child is free" in summaries
