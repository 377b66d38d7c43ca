"""The Temporal UI explains a delivery: summary line, details, activity summaries, search by the producer's id."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.contrib.pydantic import pydantic_data_converter

from routing.delivery import CommitResult, DeliveryInput, TodoRef
from tests.conftest import Stack
from tests.helpers import issue_payload, post_github
from workflows import explain, search


def _delivery(payload: Any, *, source: str = "github", headers: dict[str, str] | None = None) -> DeliveryInput:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return DeliveryInput(
        webhook_id="wh_x",
        endpoint_id="ep_x",
        source=source,
        kind=None,
        external_id="wh_x:d-1",
        trust_mode="signed",
        verified=True,
        verify_detail="hmac-sha256",
        content_type="application/json",
        headers=headers if headers is not None else {"x-github-event": "issues", "x-github-delivery": "d-1"},
        body_b64=base64.b64encode(body).decode(),
        source_ip=None,
        received_at="2026-01-01T00:00:00+00:00",
    )


def _summary(delivery: DeliveryInput) -> str:
    return explain.summary_line(delivery, explain.received_envelope(delivery))


def test_summary_names_source_kind_action_and_subject() -> None:
    assert _summary(_delivery(issue_payload(number=12))) == "github issues opened acme/app#12"


def test_summary_of_a_pull_request_and_of_a_body_that_is_not_json() -> None:
    pr = _delivery(
        {"action": "closed", "pull_request": {"number": 3}, "repository": {"full_name": "acme/app"}},
        headers={"x-github-event": "pull_request"},
    )
    assert _summary(pr) == "github pull_request closed acme/app#3"
    assert _summary(_delivery(b"\xff not json", headers={})) == "github"


def test_producer_text_cannot_put_links_or_lines_into_the_ui() -> None:
    hostile = issue_payload(action="opened\n# [click](https://evil.example)<img>")
    line = _summary(_delivery(hostile))
    assert "\n" not in line and "](" not in line and "<img>" not in line
    assert line.startswith("github issues opened # \\[click\\]\\(")
    assert len(_summary(_delivery(issue_payload(action="x" * 5000)))) <= 2 * explain.MAX_SUMMARY_CHARS


def test_producer_delivery_id_is_the_attribute_and_a_huge_body_is_not_parsed_again() -> None:
    delivery = _delivery(issue_payload())
    assert explain.delivery_attribute(delivery, explain.received_envelope(delivery)) == "d-1"
    assert explain.delivery_attribute(_delivery(issue_payload(), headers={}), None) is None
    huge = _delivery(b'{"pad": "' + b"x" * (explain.MAX_DESCRIBED_BODY + 10) + b'"}')
    assert explain.received_envelope(huge) is None
    assert explain.summary_line(huge, None) == "github"


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
