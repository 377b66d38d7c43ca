"""A fake GitHub, for tests and the fault campaign (GitHub is outside the product): it sends webhook deliveries
and keeps their log, and serves the REST API of that log.

* ``send`` POSTs a signed delivery (``X-Hub-Signature-256`` with the hook's secret, a fresh ``X-GitHub-Delivery``
  guid) to the hook's URL and records the attempt as GitHub does: the status code, or ``0`` and "failed to connect
  to host" when nothing answered (a refused connection). GitHub never retries.
* ``GET …/hooks/{id}/deliveries`` lists a hook's attempts newest first, ``per_page`` at most ``page_size``, the
  next page named by ``cursor`` in a ``Link`` header; ``POST …/deliveries/{id}/attempts`` answers 202 and sends
  that attempt's body again, signed, with the same guid, recording a new attempt with ``redelivery: true``.
  Repository (``/repos/{owner}/{repo}/hooks/{id}``), organization (``/orgs/{org}/hooks/{id}``) and app
  (``/app/hook``) hooks.
* Every API request is recorded (method, path, query, Authorization header, time). A wrong token answers 401,
  an unknown hook 404; ``script`` queues answers (a 429 with ``Retry-After``, a secondary rate limit, a redirect)
  that the next API requests get instead.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from tests.signing import sign_github

GITHUB_TIMEOUT = 10.0  # GitHub gives up on a delivery after 10 s
_API = re.compile(
    r"^(?P<hook>/repos/[^/]+/[^/]+/hooks/\d+|/orgs/[^/]+/hooks/\d+|/app/hook)/deliveries(?:/(?P<id>\d+)/attempts)?$"
)


@dataclass
class Attempt:
    """One delivery attempt in the log."""

    id: int
    guid: str
    event: str
    action: str | None
    body: bytes
    delivered_at: datetime
    redelivery: bool
    status_code: int
    status: str

    def listed(self) -> dict[str, Any]:
        """The attempt as GitHub's list shows it."""
        return {
            "id": self.id,
            "guid": self.guid,
            "delivered_at": self.delivered_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "redelivery": self.redelivery,
            "duration": 0.1,
            "status": self.status,
            "status_code": self.status_code,
            "event": self.event,
            "action": self.action,
            "installation_id": None,
            "repository_id": None,
        }


@dataclass
class FakeHook:
    """A hook: where its deliveries go, the secret they are signed with, its log."""

    path: str
    url: str
    secret: bytes
    hook_id: int | None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def delivery_guids(self) -> list[str]:
        """Every guid sent, in order, once each."""
        return list(dict.fromkeys(a.guid for a in self.attempts))


@dataclass
class Scripted:
    """An answer an API request gets instead of the real one (status 0: the real one, with these headers added)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    only: str | None = None  # "GET" or "POST": only a request of that method takes it
    after: int = 0  # let this many such requests pass first


@dataclass
class ApiRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    authorization: str | None
    at: float


class FakeGitHub:
    """The fake's state: its hooks and their logs, the token it accepts, scripted answers, what it was asked."""

    def __init__(self, token: str, *, page_size: int = 100) -> None:
        self.token = token
        self.page_size = page_size
        self.url = ""
        self.link_base: str | None = None  # Link headers name this base instead of ours (we must not follow it)
        self.hooks: dict[str, FakeHook] = {}
        self.script: deque[Scripted] = deque()
        self.requests: list[ApiRequest] = []
        self.redeliveries: list[tuple[str, int, str]] = []  # (hook path, attempt id, guid) of accepted requests
        self._ids = itertools.count(1_000_001)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # A port that refuses connections (bound, never listening): a producer's view of an API that is down.
        self._dead = socket.socket()
        self._dead.bind(("127.0.0.1", 0))
        self.dead_url = f"http://127.0.0.1:{self._dead.getsockname()[1]}/webhooks/w/down"

    # --- hooks and deliveries (GitHub's sending side)

    def hook(self, scope: str, url: str, secret: bytes, hook_id: int | None = None) -> FakeHook:
        """A hook: scope "repos/acme/app" or "orgs/acme" (with hook_id), or "app" (the app's own hook)."""
        path = "/app/hook" if scope == "app" else f"/{scope}/hooks/{hook_id}"
        found = FakeHook(path, url, secret, hook_id)
        self.hooks[path] = found
        return found

    def send(
        self,
        hook: FakeHook,
        payload: Any,
        *,
        event: str = "issues",
        guid: str | None = None,
        recorded_status: int | None = None,
        url: str | None = None,
    ) -> Attempt:
        """POST one signed delivery to the hook's URL (or ``url``) and log the attempt, never retried.

        ``recorded_status`` logs another status than the receiver answered: GitHub gave up waiting, or the
        answer was lost on the way back, although the delivery reached the receiver.
        """
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        action = payload.get("action") if isinstance(payload, dict) else None
        return self._deliver(hook, body, guid or str(uuid.uuid4()), event, action, False, recorded_status, url)

    def redeliver(self, hook: FakeHook, attempt_id: int) -> Attempt:
        """Send an attempt's delivery again with its guid, as GitHub does on request (or from its UI)."""
        original = next(a for a in hook.attempts if a.id == attempt_id)
        return self._deliver(hook, original.body, original.guid, original.event, original.action, True, None, None)

    def _deliver(
        self,
        hook: FakeHook,
        body: bytes,
        guid: str,
        event: str,
        action: str | None,
        redelivery: bool,
        recorded_status: int | None,
        url: str | None,
    ) -> Attempt:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/fake",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": guid,
            "X-GitHub-Hook-ID": str(hook.hook_id or 0),
            **sign_github(hook.secret, body),
        }
        try:
            resp = httpx.post(url or hook.url, content=body, headers=headers, timeout=GITHUB_TIMEOUT)
            code, status = resp.status_code, "OK" if resp.is_success else f"Invalid HTTP Response: {resp.status_code}"
        except httpx.HTTPError:
            code, status = 0, "failed to connect to host"
        if recorded_status is not None:
            code, status = recorded_status, "OK" if 200 <= recorded_status < 300 else "timed out"
        with self._lock:
            attempt = Attempt(next(self._ids), guid, event, action, body, datetime.now(UTC), redelivery, code, status)
            hook.attempts.append(attempt)
        return attempt

    def redelivery_counts(self) -> dict[str, int]:
        """Accepted redelivery requests per guid."""
        counts: dict[str, int] = {}
        for _, _, guid in self.redeliveries:
            counts[guid] = counts.get(guid, 0) + 1
        return counts

    def api_requests(self, method: str | None = None) -> list[ApiRequest]:
        """The API requests so far (of one method)."""
        with self._lock:
            return [r for r in self.requests if method is None or r.method == method]

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every redelivery the API started has been sent."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(deadline - time.monotonic(), 0))

    # --- the REST API (GitHub's answering side)

    def handle(self, method: str, raw_path: str, authorization: str | None) -> tuple[int, dict[str, str], Any]:
        """One API request: status, headers and JSON body."""
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        with self._lock:
            self.requests.append(ApiRequest(method, parts.path, query, authorization, time.time()))
            scripted = next((s for s in self.script if s.only in (None, method)), None)
            if scripted is not None and scripted.after:
                scripted.after -= 1
                scripted = None
            elif scripted is not None:
                self.script.remove(scripted)
        if scripted is not None and scripted.status:
            # Instead of the real answer: nothing the real one would do (a redelivery) happens.
            return scripted.status, {**_limits(), **scripted.headers}, scripted.body
        status, headers, body = self._answer(method, parts.path, query, authorization)
        return status, {**headers, **(scripted.headers if scripted is not None else {})}, body

    def _answer(
        self, method: str, path: str, query: dict[str, list[str]], authorization: str | None
    ) -> tuple[int, dict[str, str], Any]:
        headers = _limits()
        if authorization != f"Bearer {self.token}":
            return 401, headers, {"message": "Bad credentials"}
        found = _API.match(path)
        hook = self.hooks.get(found["hook"]) if found else None
        if found is None or hook is None:
            return 404, headers, {"message": "Not Found"}
        if method == "POST" and found["id"] is not None:
            attempt_id = int(found["id"])
            original = next((a for a in hook.attempts if a.id == attempt_id), None)
            if original is None:
                return 404, headers, {"message": "Not Found"}
            with self._lock:
                self.redeliveries.append((hook.path, attempt_id, original.guid))
            thread = threading.Thread(target=self.redeliver, args=(hook, attempt_id), daemon=True)
            self._threads.append(thread)
            thread.start()
            return 202, headers, {}
        if method != "GET" or found["id"] is not None:
            return 404, headers, {"message": "Not Found"}
        per_page = min(int(query.get("per_page", ["30"])[0]), 100, self.page_size)
        with self._lock:
            newest_first = sorted(hook.attempts, key=lambda a: a.id, reverse=True)
        if "cursor" in query:
            below = int(query["cursor"][0])
            newest_first = [a for a in newest_first if a.id < below]
        page = newest_first[:per_page]
        if len(newest_first) > per_page:
            base = self.link_base or self.url
            headers["link"] = f'<{base}{path}?per_page={per_page}&cursor={page[-1].id}>; rel="next"'
        return 200, headers, [a.listed() for a in page]


def _limits() -> dict[str, str]:
    """The rate-limit headers GitHub puts on every answer: a window far from spent."""
    return {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "4999",
        "x-ratelimit-reset": str(int(time.time()) + 3600),
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        status, headers, body = self.server.github.handle(method, self.path, self.headers.get("authorization"))
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    github: FakeGitHub


@contextlib.contextmanager
def fake_github(token: str, *, page_size: int = 100) -> Iterator[FakeGitHub]:
    """A running fake GitHub on a free localhost port (its API base URL is ``.url``)."""
    github = FakeGitHub(token, page_size=page_size)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.github = github
    github.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield github
    finally:
        server.shutdown()
        server.server_close()
        github.wait_idle(5)
        github._dead.close()


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Another host that records every request's headers (a redirect target a token must never reach)."""
    seen: list[dict[str, str]] = []

    class Recorder(BaseHTTPRequestHandler):
        def _any(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

        do_GET = do_POST = _any

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
