"""Fake producers: signed deliveries the way GitHub, Gitea and generic senders post them."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import httpx

from routing.delivery import DeliveryInput
from routing.rules import check_expression, compile_candidates
from tests.routing.in_process import check_in_process
from tests.signing import sign_gitea, sign_github

T = TypeVar("T")


def issue_payload(
    number: int = 7, title: str = "Fix the build", action: str = "opened", **extra: Any
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "action": action,
        "issue": {
            "number": number,
            "title": title,
            "html_url": f"https://github.com/acme/app/issues/{number}",
            "state": "open",
            "user": {"login": "joestump"},
            "labels": [],
            "body": "It is broken.",
        },
        "repository": {"full_name": "acme/app"},
        "sender": {"login": "joestump"},
    }
    payload.update(extra)
    return payload


def delivery_input(body: bytes = b"{}", **fields: Any) -> DeliveryInput:
    """A verified GitHub delivery as a receiver would build it (``fields`` override any field)."""
    values: dict[str, Any] = {
        "webhook_id": "wh_1",
        "endpoint_id": "ep_a",
        "source": "github",
        "kind": "issues",
        "external_id": "wh_1:d1",
        "trust_mode": "signed",
        "verified": True,
        "verify_detail": "ok",
        "content_type": "application/json",
        "headers": {"x-github-event": "issues"},
        "body": body,
        "source_ip": None,
        "received_at": "2026-01-01T00:00:00+00:00",
    }
    values.update(fields)
    return DeliveryInput(**values)


class NoFreeChild:
    """A real sandbox whose fast path never finds a free child (every child busy, or someone waiting): every run
    evaluates on the fair evaluate queue."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.slots = inner.slots

    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.evaluate(*args, **kwargs)

    async def evaluate_if_free(self, *_: Any) -> Any:
        return None


def token_of(ingest_url: str) -> str:
    return ingest_url.rsplit("/", 1)[-1]


async def post_github(
    http: httpx.AsyncClient,
    webhook: dict[str, Any],
    payload: Any,
    *,
    delivery: str | None = None,
    event: str = "issues",
    secret: str | None = None,
    extra_headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
    }
    headers.update(sign_github((secret or webhook["secret"]).encode(), body))
    headers.update(extra_headers or {})
    return await http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=body, headers=headers)


async def post_gitea(
    http: httpx.AsyncClient, webhook: dict[str, Any], payload: Any, *, delivery: str
) -> httpx.Response:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-Gitea-Event": "issues", "X-Gitea-Delivery": delivery}
    headers.update(sign_gitea(webhook["secret"].encode(), body))
    return await http.post(f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=body, headers=headers)


@overload
async def eventually(probe: Callable[[], Awaitable[T | None]], timeout: float = ..., interval: float = ...) -> T: ...
@overload
async def eventually(probe: Callable[[], T | None], timeout: float = ..., interval: float = ...) -> T: ...
async def eventually(probe: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1) -> Any:
    """Poll ``probe`` (sync or async) until it returns something truthy, and return that; fail after ``timeout``.

    The suite's one way to wait for a condition: the machine may be loaded, so bounds are generous and a test
    never sleeps a fixed time where it can poll.
    """
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(interval)


def compiled_here(rules: Any) -> dict[str, str | None]:
    """Save-time compile verdicts for a candidate list, compiled in this process (validation unit tests only).

    The server compiles in the rule sandbox's capped child (SandboxPool.check); check_in_process is the same
    RuleEngine.prepare without the cap, so a unit test of validation sees the verdicts the child would give.
    """
    exprs = compile_candidates(rules)
    return dict(zip(exprs, check_in_process(exprs), strict=True))


def check_here(expr: str) -> tuple[str, str] | None:
    """check_expression with the expression's compile verdict computed in this process (tests only)."""
    return check_expression(expr, compiled_here([{"expr": expr}]))
