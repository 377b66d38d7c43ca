"""Request ids: the one validation of an inbound X-Request-Id, and its journey through Temporal.

The API binds a request's id (``switchboard.logs.REQUEST_ID``) for the life of the request; every workflow that
request starts carries it in a Temporal header (``HEADER``), and the workflow's interceptor binds it for the run
and passes it on, in the same header, to every activity and local activity the run schedules, whose interceptor
binds it while the activity runs. So the lines of the request, of its workflow and of its activities all carry
one id, whichever process logs them.

A header rather than a field of the workflow input: the input is the delivery (routing/delivery.py), recorded in
history and replayed; a header is metadata that replay does not compare, so histories recorded before this
change replay unchanged (no header: no id), the input model stays the delivery's alone, and the same interceptor
carries the id for every workflow type (RerouteEvents too). A delivery that the inbox relay starts later, not the
request, has no id: the relay's start happens outside any request.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any, NoReturn

from temporalio import client, worker, workflow
from temporalio.api.common.v1 import Payload

from switchboard.logs import REQUEST_ID

HEADER = "switchboard-request-id"
"""The Temporal header that carries the request id from a start to the run and from the run to its activities."""

MAX_LENGTH = 128
# Ids from proxies and producers: UUIDs, hex, base64-ish tokens, dotted or colon-separated trace ids.
_SAFE = re.compile(rf"[A-Za-z0-9._:+/=-]{{1,{MAX_LENGTH}}}")


def new_request_id() -> str:
    """A fresh request id (16 hex characters)."""
    return secrets.token_hex(8)


def accepted_request_id(inbound: str | None) -> str:
    """The inbound X-Request-Id when it is short and of the safe charset, else a fresh id.

    An id that fails the check is replaced, never trimmed or escaped: whatever reaches a log line, a response
    header or a Temporal header is known to be plain.
    """
    if inbound is not None and _SAFE.fullmatch(inbound):
        return inbound
    return new_request_id()


_JSON_PLAIN = {"encoding": b"json/plain"}


def _with_request_id(headers: Mapping[str, Payload], request_id: str | None) -> Mapping[str, Payload]:
    if not request_id:
        return headers
    # The payload the default converter writes for a str, built directly without the converter's lookup: this runs
    # on every start and every activity a request's run schedules.
    payload = Payload(metadata=_JSON_PLAIN, data=json.dumps(request_id).encode())
    return {**headers, HEADER: payload}


def _request_id_from(headers: Mapping[str, Payload]) -> str | None:
    payload = headers.get(HEADER) if headers else None
    if payload is None:
        return None
    if payload.metadata.get("encoding") != _JSON_PLAIN["encoding"]:
        return None
    try:
        value = json.loads(payload.data)
    except ValueError:  # an unreadable header is no id, never a failed task
        return None
    # Re-checked on the way in: another client could have written anything into the header.
    return value if isinstance(value, str) and _SAFE.fullmatch(value) else None


class RequestIdInterceptor(client.Interceptor, worker.Interceptor):
    """Carries the bound request id on workflow starts, and binds it in workflow runs and activities.

    On the client (so it also applies to every worker built on that client): switchboard/temporal.py installs it.
    """

    def intercept_client(self, next: client.OutboundInterceptor) -> client.OutboundInterceptor:
        """Adds the header to workflow starts made while a request id is bound."""
        return _ClientOutbound(next)

    def intercept_activity(self, next: worker.ActivityInboundInterceptor) -> worker.ActivityInboundInterceptor:
        """Binds the header's id while the activity (local or not) runs."""
        return _ActivityInbound(next)

    def workflow_interceptor_class(
        self, input: worker.WorkflowInterceptorClassInput
    ) -> type[worker.WorkflowInboundInterceptor]:
        """Binds the start's id for the run and passes it to the run's activities."""
        return _WorkflowInbound


class _ClientOutbound(client.OutboundInterceptor):
    async def start_workflow(self, input: client.StartWorkflowInput) -> client.WorkflowHandle[Any, Any]:
        input.headers = _with_request_id(input.headers, REQUEST_ID.get())
        return await super().start_workflow(input)


class _ActivityInbound(worker.ActivityInboundInterceptor):
    async def execute_activity(self, input: worker.ExecuteActivityInput) -> Any:
        request_id = _request_id_from(input.headers)
        if request_id is None:
            return await super().execute_activity(input)
        token = REQUEST_ID.set(request_id)
        try:
            return await super().execute_activity(input)
        finally:
            REQUEST_ID.reset(token)


class _WorkflowInbound(worker.WorkflowInboundInterceptor):
    # Runs inside the workflow sandbox: no I/O, no clock; reading a header and a context variable is neither, and
    # neither issues a command, so replay is untouched.
    request_id: str | None = None

    def init(self, outbound: worker.WorkflowOutboundInterceptor) -> None:
        super().init(_WorkflowOutbound(outbound, self))

    async def execute_workflow(self, input: worker.ExecuteWorkflowInput) -> Any:
        self.request_id = _request_id_from(input.headers)
        if self.request_id is None:
            return await super().execute_workflow(input)
        # The run's main task: workflow.logger lines it makes (and tasks it creates) see the id.
        token = REQUEST_ID.set(self.request_id)
        try:
            return await super().execute_workflow(input)
        finally:
            REQUEST_ID.reset(token)


class _WorkflowOutbound(worker.WorkflowOutboundInterceptor):
    def __init__(self, next: worker.WorkflowOutboundInterceptor, root: _WorkflowInbound) -> None:
        super().__init__(next)
        self._root = root

    def start_activity(self, input: worker.StartActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = _with_request_id(input.headers, self._root.request_id)
        return super().start_activity(input)

    def start_local_activity(self, input: worker.StartLocalActivityInput) -> workflow.ActivityHandle[Any]:
        input.headers = _with_request_id(input.headers, self._root.request_id)
        return super().start_local_activity(input)

    def continue_as_new(self, input: worker.ContinueAsNewInput) -> NoReturn:
        input.headers = _with_request_id(input.headers, self._root.request_id)
        super().continue_as_new(input)
