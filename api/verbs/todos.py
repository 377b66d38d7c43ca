"""Drain verbs: list, get, claim, claim_next, complete, fail, heartbeat, release; retry and cancel."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from api.verbs.registry import READ, AnyJson, CliArg, CliCommand, CliExport, Context, Hints, VerbInput, verb
from store.models import Todo
from store.todos import DEFAULT_LEASE_SECONDS, MAX_CLAIM_BATCH, MAX_LEASE_SECONDS
from switchboard.metrics import CLAIMS, DEAD_LETTERS, bounded

TODOS_HELP = "todos (as their endpoint)"
State = Literal["pending", "claimed", "done", "failed", "canceled"]

TodoId = Annotated[str, Field(min_length=1, max_length=100, description="the todo's id (td_…)")]
HeldTodoId = Annotated[
    str, Field(min_length=1, max_length=100, description="the id of a todo this agent holds (claimed by it)")
]
# Longer leases are clamped to the maximum, not refused (the documented lease contract): the schema advertises
# the maximum that takes effect, so a client that checks it never asks for more, and one that does still works.
_Lease = Annotated[int, Field(ge=1, json_schema_extra={"maximum": MAX_LEASE_SECONDS})]
LeaseSeconds = Annotated[
    _Lease | None,
    Field(
        default=None,
        description=(
            f"lease length in seconds (default {DEFAULT_LEASE_SECONDS}, at most {MAX_LEASE_SECONDS};"
            " a longer one is clamped); the todo returns to pending if the lease lapses"
        ),
    ),
]
QueueFilter = Annotated[
    str | None, Field(default=None, description="only this queue (one of your scope queues); omitted: all of them")
]


class TodoOut(BaseModel):
    """A todo as agents see it, with its routing trace and work order."""

    id: str
    endpoint_id: str
    queue: str
    source: str
    kind: str | None
    title: str
    state: str
    owner: str | None
    attempt: int
    max_attempts: int
    lease_expires_at: datetime | None
    next_retry_at: datetime | None
    event_id: str | None
    idempotency_key: str
    created_at: datetime
    updated_at: datetime
    claimed_at: datetime | None
    completed_at: datetime | None
    last_error: str | None = None
    result: AnyJson = Field(default=None, description="what complete or fail recorded (any JSON value)")
    routing: dict[str, Any] | None = None
    work_order: dict[str, Any] | None = None
    payload: AnyJson = Field(default=None, description="the delivery's body as JSON; null when it is not JSON")
    update_event_ids: list[str] = Field(default_factory=list, description="events coalesced into this todo")
    cancel_reason: str | None = Field(default=None, description="the reason cancel_todo was given, if any")


class TodoSummary(BaseModel):
    """A compact row for list_todos."""

    id: str
    queue: str
    state: str
    attempt: int
    title: str
    kind: str | None
    source: str
    owner: str | None
    created_at: datetime
    lease_expires_at: datetime | None
    next_retry_at: datetime | None
    routing: dict[str, Any] | None = None
    work_order: dict[str, Any] | None = None


def _full(todo: Todo) -> TodoOut:
    # Validated from the store model's own field values, not from a dump of them: a dump copies every value first.
    return TodoOut.model_validate(todo.__dict__)


class ListTodosInput(VerbInput):
    queue: QueueFilter
    state: State | None = Field(default=None, description="only todos in this state; omitted: every state")
    limit: int = Field(default=50, ge=1, le=500, description="the most rows to return")
    cursor: str | None = Field(default=None, max_length=1000, description="next_cursor of the previous page")


class ListTodosOutput(BaseModel):
    todos: list[TodoSummary]
    next_cursor: str | None = Field(default=None, description="pass as cursor for the next page; absent at the end")


class TodoIdInput(VerbInput):
    todo_id: TodoId


class HeldTodoInput(VerbInput):
    todo_id: HeldTodoId


class ClaimInput(VerbInput):
    todo_id: Annotated[str, Field(min_length=1, max_length=100, description="the id of a pending todo")]
    lease_seconds: LeaseSeconds


class ClaimNextInput(VerbInput):
    queue: QueueFilter
    lease_seconds: LeaseSeconds
    max: int | None = Field(
        default=None,
        ge=1,
        le=MAX_CLAIM_BATCH,
        description=(
            f"claim up to this many of the oldest pending todos at once (at most {MAX_CLAIM_BATCH}), answered as"
            " todos, oldest first; each has its own lease. Omitted: one todo, answered as todo"
        ),
    )


class ClaimNextOutput(BaseModel):
    empty: bool = Field(default=False, description="no pending todo in scope was free to claim")
    todo: TodoOut | None = Field(default=None, description="the todo claimed (without max)")
    # A call without max answers in the single-todo shape alone: {empty, todo}.
    todos: list[TodoOut] | None = Field(
        default=None, exclude_if=lambda todos: todos is None, description="with max: every todo claimed, oldest first"
    )


class CompleteInput(VerbInput):
    todo_id: HeldTodoId
    result: AnyJson = Field(default=None, description="any JSON value recorded on the todo as its outcome")


class FailInput(VerbInput):
    todo_id: HeldTodoId
    error: str | None = Field(default=None, max_length=4000, description="why it failed, kept as last_error")
    result: AnyJson = Field(default=None, description="any JSON value to record; omitted: the todo's result stays")


class HeartbeatInput(VerbInput):
    todo_id: HeldTodoId
    lease_seconds: Annotated[
        _Lease | None,
        Field(
            default=None,
            description=(
                f"the new lease from now, in seconds (default {DEFAULT_LEASE_SECONDS}, at most"
                f" {MAX_LEASE_SECONDS}; a longer one is clamped)"
            ),
        ),
    ]


class CancelInput(VerbInput):
    todo_id: TodoId
    reason: str | None = Field(default=None, max_length=4000, description="why, shown on the todo (cancel_reason)")


class TodoResult(BaseModel):
    todo: TodoOut


@verb(
    "list_todos",
    input=ListTodosInput,
    output=ListTodosOutput,
    family="todos",
    summary="List todos in the endpoint's queues, newest first; pages by cursor.",
    hints=READ,
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="list",
        help="list_todos: todos in your endpoint's queues, newest first",
        args=(
            CliArg("queue", "--queue", help="only this queue"),
            CliArg("state", "--state", choices=("pending", "claimed", "done", "failed", "canceled")),
            CliArg("limit", "--limit", type="int", help="the most todos (≤ 500, default 50)"),
            CliArg("cursor", "--cursor", help="next_cursor of the previous page"),
        ),
        columns=("id", "queue", "state", "attempt", "kind", "title", "owner", "created_at"),
    ),
)
async def list_todos(ctx: Context, data: ListTodosInput) -> ListTodosOutput:
    page = await ctx.services.todos.list(ctx.caller, data.queue, data.state, data.limit, data.cursor)
    return ListTodosOutput(
        todos=[TodoSummary.model_validate(r.model_dump()) for r in page.todos], next_cursor=page.next_cursor
    )


@verb(
    "get_todo",
    input=TodoIdInput,
    output=TodoResult,
    family="todos",
    summary="One todo with its trace and payload.",
    hints=READ,
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="get",
        help="get_todo: one todo with its trace, work order and payload",
        args=(CliArg("todo_id", help="the todo (td_…)"),),
    ),
)
async def get_todo(ctx: Context, data: TodoIdInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.get(ctx.caller, data.todo_id)))


@verb(
    "claim",
    input=ClaimInput,
    output=TodoResult,
    family="todos",
    summary="Claim a pending todo with a lease.",
    hints=Hints(idempotent=True),
)
async def claim(ctx: Context, data: ClaimInput) -> TodoResult:
    todo = await ctx.services.todos.claim(ctx.caller, data.todo_id, data.lease_seconds)
    CLAIMS.labels(queue=bounded(todo.queue)).inc()
    return TodoResult(todo=_full(todo))


@verb(
    "claim_next",
    input=ClaimNextInput,
    output=ClaimNextOutput,
    family="todos",
    summary="Claim the oldest pending todo in scope (with max, up to max of them); {empty: true} when there is none.",
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="claim-next",
        help="claim_next: claim the oldest pending todo in your queues (empty: true when there is none)",
        args=(
            CliArg("queue", "--queue", help="only this queue"),
            CliArg("lease_seconds", "--lease", type="int", help="lease in seconds (default 300)"),
        ),
        exports=(CliExport("todo.id", "TODO_ID"),),
    ),
)
async def claim_next(ctx: Context, data: ClaimNextInput) -> ClaimNextOutput:
    if data.max is not None:
        todos = await ctx.services.todos.claim_many(ctx.caller, data.queue, data.lease_seconds, data.max)
        for todo in todos:
            CLAIMS.labels(queue=bounded(todo.queue)).inc()
        return ClaimNextOutput(empty=not todos, todos=[_full(t) for t in todos])
    one = await ctx.services.todos.claim_next(ctx.caller, data.queue, data.lease_seconds)
    if one is None:
        return ClaimNextOutput(empty=True)
    CLAIMS.labels(queue=bounded(one.queue)).inc()
    return ClaimNextOutput(todo=_full(one))


@verb(
    "complete",
    input=CompleteInput,
    output=TodoResult,
    family="todos",
    summary="Mark a held todo done.",
    hints=Hints(idempotent=True),
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="complete",
        help="complete: mark a todo you hold done",
        args=(CliArg("todo_id", help="the todo (td_…)"),),
    ),
)
async def complete(ctx: Context, data: CompleteInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.complete(ctx.caller, data.todo_id, data.result)))


@verb(
    "fail",
    input=FailInput,
    output=TodoResult,
    family="todos",
    summary="Fail a held todo: retry after backoff, or dead letter at the attempt cap.",
    hints=Hints(idempotent=True),
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="fail",
        help="fail: a todo you hold failed (retried after a backoff, dead letter at the attempt cap)",
        args=(CliArg("todo_id", help="the todo (td_…)"), CliArg("error", "--error", help="why, kept as last_error")),
    ),
)
async def fail(ctx: Context, data: FailInput) -> TodoResult:
    todo = await ctx.services.todos.fail(ctx.caller, data.todo_id, data.error, data.result)
    if todo.state == "failed" and todo.next_retry_at is None:  # at the attempt cap: a dead letter
        DEAD_LETTERS.labels(cause="failed").inc()
    return TodoResult(todo=_full(todo))


@verb(
    "heartbeat",
    input=HeartbeatInput,
    output=TodoResult,
    family="todos",
    summary="Extend the lease on a held todo.",
)
async def heartbeat(ctx: Context, data: HeartbeatInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.heartbeat(ctx.caller, data.todo_id, data.lease_seconds)))


@verb(
    "release",
    input=HeldTodoInput,
    output=TodoResult,
    family="todos",
    summary="Give a held todo back to the queue.",
    hints=Hints(idempotent=True),
)
async def release(ctx: Context, data: HeldTodoInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.release(ctx.caller, data.todo_id)))


@verb(
    "retry_todo",
    input=TodoIdInput,
    output=TodoResult,
    family="todos",
    summary="Put a failed todo (parked or dead-lettered) back to pending now; a dead letter gets a fresh attempt budget.",
    # A repeat finds the todo pending and answers conflict: nothing changes twice.
    hints=Hints(idempotent=True),
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="retry",
        help="retry_todo: a failed todo back to pending now (a dead letter gets a fresh attempt budget)",
        args=(CliArg("todo_id", help="the todo (td_…)"),),
    ),
)
async def retry_todo(ctx: Context, data: TodoIdInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.retry(ctx.caller, data.todo_id)))


@verb(
    "cancel_todo",
    input=CancelInput,
    output=TodoResult,
    family="todos",
    summary="Cancel a pending or failed todo (terminal; never retried), with an optional reason.",
    hints=Hints(destructive=True, idempotent=True),
    cli=CliCommand(
        group="todos",
        group_help=TODOS_HELP,
        action="cancel",
        help="cancel_todo: a pending or failed todo to canceled",
        args=(CliArg("todo_id", help="the todo (td_…)"), CliArg("reason", flag="--reason", help="why")),
    ),
)
async def cancel_todo(ctx: Context, data: CancelInput) -> TodoResult:
    return TodoResult(todo=_full(await ctx.services.todos.cancel(ctx.caller, data.todo_id, data.reason)))
