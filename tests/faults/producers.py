"""The fault campaign's producers: fake GitHub senders, a duplicate storm, and SSE clients counting rings.

Senders are fake GitHub producers: signed with the webhook secret, a fresh `X-GitHub-Delivery` id per delivery,
over real HTTP to localhost only, bounded in request count and time, never retrying (GitHub does not redeliver a
failed delivery).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from dataclasses import dataclass

import httpx

from tests.faults.stack import FaultStack, Hook
from tests.signing import sign_github


@dataclass
class Answer:
    """What one producer's POST heard back."""

    delivery: str
    api: int
    started: float  # wall clock (time.time())
    took: float
    status: int | None  # None: no HTTP answer (refused, reset, timed out)
    error: str | None = None
    created: int | None = None
    pending: bool = False
    duplicate: bool = False


def issue_body(n: int, delivery: str) -> bytes:
    return json.dumps(
        {
            "action": "opened",
            "issue": {"number": n, "title": f"issue {n} ({delivery[:8]})", "body": "x" * 500},
            "repository": {"full_name": "acme/app"},
            "sender": {"login": "joe"},
        }
    ).encode()


async def post_delivery(
    http: httpx.AsyncClient,
    base: str,
    api: int,
    hook: Hook,
    delivery: str,
    body: bytes,
    content_type: str = "application/json",
) -> Answer:
    """One signed GitHub `issues` delivery; never retried."""
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery, "Content-Type": content_type}
    headers.update(sign_github(hook.secret, body))
    started, t0 = time.time(), time.perf_counter()
    try:
        resp = await http.post(f"{base}/webhooks/w/{hook.token}", content=body, headers=headers)
    except httpx.HTTPError as exc:
        return Answer(delivery, api, started, time.perf_counter() - t0, None, error=type(exc).__name__)
    took = time.perf_counter() - t0
    answer = Answer(delivery, api, started, took, resp.status_code)
    if resp.status_code == 202:
        with contextlib.suppress(ValueError):
            data = resp.json()
            answer.created = data.get("created")
            answer.pending = bool(data.get("pending"))
            answer.duplicate = bool(data.get("duplicate"))
    return answer


class Load:
    """`senders` producers posting fresh deliveries until stopped or out of budget, spread over the APIs.

    With several APIs the senders act as a load balancer would (nginx's default `proxy_next_upstream error`):
    a connection refused, where nothing was sent, is tried once on the next API; any other failure (reset,
    timeout, an answer) stands, because the delivery may have been taken.
    """

    def __init__(
        self,
        stack: FaultStack,
        hook: Hook,
        *,
        senders: int = 4,
        interval: float = 0.25,
        max_requests: int = 2000,
        max_seconds: float = 600.0,
    ) -> None:
        self.stack = stack
        self.hook = hook
        self.senders = senders
        self.interval = interval
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.answers: list[Answer] = []
        self._stop = asyncio.Event()
        self._progress = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._sent = 0
        self.failovers = 0

    async def _sender(self, k: int) -> None:
        deadline = time.monotonic() + self.max_seconds
        async with httpx.AsyncClient(timeout=30) as http:
            i = k
            while not self._stop.is_set() and self._sent < self.max_requests and time.monotonic() < deadline:
                self._sent += 1
                api = i % len(self.stack.apis)
                delivery = str(uuid.uuid4())
                body = issue_body(i, delivery)
                base = self.stack.base(self.stack.apis[api])
                answer = await post_delivery(http, base, api, self.hook, delivery, body)
                if answer.error == "ConnectError" and len(self.stack.apis) > 1:
                    self.failovers += 1
                    api = (api + 1) % len(self.stack.apis)
                    base = self.stack.base(self.stack.apis[api])
                    answer = await post_delivery(http, base, api, self.hook, delivery, body)
                self.answers.append(answer)
                async with self._progress:
                    self._progress.notify_all()
                i += self.senders
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._sender(k)) for k in range(self.senders)]

    async def stop(self) -> list[Answer]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.answers

    async def until(self, count: int, within: float = 120) -> None:
        """Wait until `count` more answers arrived (so a fault lands under load)."""
        target = len(self.answers) + count
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self._progress:
                await self._progress.wait_for(lambda: len(self.answers) >= target)


async def storm(stack: FaultStack, hook: Hook, ids: int, posts: int, concurrency: int) -> list[Answer]:
    """`ids` deliveries each posted `posts` times (same id, same body), `concurrency` posts in flight."""
    work = [(n, f"storm-{n}-{uuid.uuid4().hex[:8]}") for n in range(ids)]
    queue = [item for item in work for _ in range(posts)]
    random.shuffle(queue)
    bodies = {d: issue_body(n, d) for n, d in work}
    answers: list[Answer] = []

    async def runner() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while queue:
                _, delivery = queue.pop()
                api = len(answers) % len(stack.apis)
                base = stack.base(stack.apis[api])
                answers.append(await post_delivery(http, base, api, hook, delivery, bodies[delivery]))

    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return answers


class Rings:
    """One SSE client on `GET /v1/stream` of one API, reconnecting after that API dies; collects todo ids."""

    def __init__(self, base: str, credential: str) -> None:
        self.base = base
        self.credential = credential
        self.todo_ids: list[str] = []
        self.subscribed = asyncio.Event()
        self.connects = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.credential}", "Accept": "text/event-stream"}
        timeout = httpx.Timeout(10.0, read=None)
        while True:
            try:
                async with (
                    httpx.AsyncClient(timeout=timeout) as http,
                    http.stream("GET", f"{self.base}/v1/stream", headers=headers) as resp,
                ):
                    if resp.status_code != 200:
                        await asyncio.sleep(0.5)
                        continue
                    self.connects += 1
                    event, ident = "", ""
                    async for line in resp.aiter_lines():
                        if line.startswith(":") and "subscribed" in line:
                            self.subscribed.set()
                        elif line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("id:"):
                            ident = line[3:].strip()
                        elif line == "":
                            if event == "todo" and ident:
                                self.todo_ids.append(ident)
                            event, ident = "", ""
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.3)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
