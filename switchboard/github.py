"""GitHub's webhook delivery log, as the reconciler uses it: list a hook's delivery attempts, ask for a redelivery.

GitHub keeps every delivery attempt of a repository, organization or GitHub App hook
(`GET …/hooks/{hook_id}/deliveries`, newest first, paged by a cursor in the `Link` header) and sends one again on
request (`POST …/deliveries/{id}/attempts`), signed, with the same `X-GitHub-Delivery` guid. Nothing from these
answers is ever ingested: a redelivery arrives through the receiver like any delivery.

Every call is bounded and goes to the configured API base URL only: one attempt, a timeout, redirects refused (a
3xx is an error, never followed), environment proxies and `.netrc` ignored, a response body capped, the next page
built from the cursor alone (never from the URL GitHub's `Link` names). The token travels in the Authorization
header of those calls and nowhere else; it is never part of an answer, a message or a repr.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

import httpx
from pydantic import BaseModel, Field, ValidationError

API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
PAGE_SIZE = 100  # GitHub's largest page
BODY_MAX = 4 * 1024 * 1024
CURSOR_MAX = 1000
# GitHub asks a client that hit a secondary rate limit without a Retry-After to wait at least a minute.
SECONDARY_WAIT = 60.0
WAIT_MAX = 24 * 3600.0

ScopeKind = Literal["repo", "org", "app"]
Outcome = Literal["ok", "rate_limited", "unauthorized", "forbidden", "not_found", "unavailable", "error", "refused"]
"""What one call came to. refused: GitHub would not redeliver this one attempt (e.g. past its window)."""


@dataclass(frozen=True)
class HookScope:
    """Which hook's log: a repository's (`owner/name` + hook id), an organization's (+ hook id), the App's own."""

    kind: ScopeKind
    name: str | None = None
    hook_id: int | None = None

    def deliveries_path(self) -> str:
        """The path of the hook's delivery list under the API base URL."""
        if self.kind == "app":
            return "/app/hook/deliveries"
        assert self.name is not None and self.hook_id is not None
        if self.kind == "repo":
            owner, _, repo = self.name.partition("/")
            return f"/repos/{quote(owner, safe='')}/{quote(repo, safe='')}/hooks/{self.hook_id}/deliveries"
        return f"/orgs/{quote(self.name, safe='')}/hooks/{self.hook_id}/deliveries"

    def describe(self) -> str:
        """One line for people: `repo acme/app hook 12`, `org acme hook 7`, `the app's hook`."""
        if self.kind == "app":
            return "the app's hook"
        return f"{self.kind} {self.name} hook {self.hook_id}"


class Attempt(BaseModel):
    """One delivery attempt as GitHub lists it (the fields the reconciler reads)."""

    id: int
    guid: str = Field(max_length=256)
    delivered_at: datetime
    redelivery: bool = False
    status: str = ""
    status_code: int = 0
    event: str = ""
    action: str | None = None

    @property
    def delivered(self) -> bool:
        """Whether the receiver answered 2xx to this attempt."""
        return 200 <= self.status_code < 300


@dataclass
class Answer:
    """What a call came to: its outcome, a short reason for people, and how long to wait before the next call."""

    outcome: Outcome
    detail: str = ""
    status: int | None = None
    wait_seconds: float | None = None


@dataclass
class Page(Answer):
    """One page of attempts, newest first, and the cursor of the next page (None: the last page)."""

    attempts: list[Attempt] = field(default_factory=list)
    next_cursor: str | None = None


class GitHubHooks:
    """Calls to one hook's delivery log with one token; use as an async context manager."""

    def __init__(self, api_url: str, token: str, scope: HookScope, *, timeout: float) -> None:
        self.api_url = api_url.rstrip("/")
        self.scope = scope
        origin = urlsplit(self.api_url)
        self._origin = (origin.scheme, origin.netloc)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            trust_env=False,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "switchboard-reconciler",
            },
        )
        self._auth = {"Authorization": f"Bearer {token}"}

    def __repr__(self) -> str:
        return f"GitHubHooks({self.api_url!r}, {self.scope.describe()!r})"

    async def __aenter__(self) -> GitHubHooks:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    def _url(self, path: str) -> str:
        url = self.api_url + path
        parts = urlsplit(url)
        # The token goes to the configured origin only, whatever a path or cursor held.
        if (parts.scheme, parts.netloc) != self._origin:
            raise ValueError("a GitHub call would leave the configured API URL")
        return url

    async def list_page(self, cursor: str | None) -> Page:
        """One page of the hook's delivery attempts, newest first; cursor None: the newest page."""
        params: dict[str, str | int] = {"per_page": PAGE_SIZE}
        if cursor is not None:
            params["cursor"] = cursor
        answer, data, headers = await self._call("GET", self.scope.deliveries_path(), params)
        page = Page(answer.outcome, answer.detail, answer.status, answer.wait_seconds)
        if answer.outcome != "ok":
            return page
        if not isinstance(data, list):
            return Page("error", "GitHub's delivery list is not a JSON array", answer.status)
        try:
            page.attempts = [Attempt.model_validate(item) for item in data]
        except ValidationError as exc:
            return Page("error", f"GitHub's delivery list does not have the expected fields ({exc.error_count()})")
        page.next_cursor = next_cursor(headers.get("link"))
        return page

    async def redeliver(self, attempt_id: int) -> Answer:
        """Ask GitHub to send one attempt's delivery again (same body, same guid, signed)."""
        path = f"{self.scope.deliveries_path()}/{int(attempt_id)}/attempts"
        answer, _, _ = await self._call("POST", path, None)
        return answer

    async def _call(
        self, method: str, path: str, params: dict[str, str | int] | None
    ) -> tuple[Answer, Any, httpx.Headers]:
        try:
            url = self._url(path)
        except ValueError as exc:
            return Answer("error", str(exc)), None, httpx.Headers()
        try:
            async with self._http.stream(method, url, params=params, headers=self._auth) as response:
                body = await _read_capped(response)
        except httpx.TimeoutException:
            return Answer("unavailable", "GitHub did not answer in time"), None, httpx.Headers()
        except httpx.HTTPError as exc:
            return Answer("unavailable", f"GitHub could not be reached ({type(exc).__name__})"), None, httpx.Headers()
        if body is None:
            return (
                Answer("error", f"GitHub's answer is over {BODY_MAX} bytes", response.status_code),
                None,
                response.headers,
            )
        answer = classify(response.status_code, response.headers, body, time.time())
        data: Any = None
        if answer.outcome == "ok" and method == "GET":
            try:
                data = json.loads(body)
            except ValueError:
                return Answer("error", "GitHub's answer is not JSON", response.status_code), None, response.headers
        return answer, data, response.headers


async def _read_capped(response: httpx.Response) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > BODY_MAX:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def classify(status: int, headers: httpx.Headers, body: bytes, now: float) -> Answer:
    """What an HTTP answer from GitHub means for the reconciler, with any wait GitHub asks for."""
    wait = rate_limit_wait(status, headers, body, now)
    if 200 <= status < 300:
        # A call that spent the last request of the window: the next one waits for the reset.
        return Answer("ok", status=status, wait_seconds=wait)
    if wait is not None:
        return Answer("rate_limited", f"GitHub rate limit ({status}): waiting {wait:.0f} s", status, wait)
    if 300 <= status < 400:
        return Answer("error", f"GitHub answered a redirect ({status}); redirects are not followed", status)
    if status == 401:
        return Answer("unauthorized", "GitHub refused the token (401): revoked, expired or mistyped", status)
    if status == 403:
        return Answer("forbidden", "the token may not read this hook's deliveries (403)", status)
    if status == 404:
        return Answer("not_found", "GitHub has no such hook, or the token cannot see it (404)", status)
    if status >= 500:
        return Answer("unavailable", f"GitHub answered {status}", status)
    return Answer("refused", f"GitHub refused the call ({status}{_message(body)})", status)


def rate_limit_wait(status: int, headers: httpx.Headers, body: bytes, now: float) -> float | None:
    """Seconds GitHub asks us to wait before the next call, or None.

    `Retry-After` (seconds or an HTTP date) first; else a spent primary window (`x-ratelimit-remaining: 0`) until
    `x-ratelimit-reset`; else, for a 429 or a 403 that says it is a rate limit, GitHub's one minute.
    """
    retry_after = _retry_after(headers.get("retry-after"), now)
    remaining = headers.get("x-ratelimit-remaining")
    reset = headers.get("x-ratelimit-reset")
    spent = remaining is not None and remaining.strip() == "0"
    limited = status == 429 or (status == 403 and (spent or retry_after is not None or b"rate limit" in body.lower()))
    if not limited and not (200 <= status < 300 and spent):
        return None
    if retry_after is not None and limited:
        return _bounded(retry_after)
    if spent and reset is not None:
        try:
            return _bounded(float(reset) - now)
        except ValueError:
            pass
    return SECONDARY_WAIT if limited else None


def _retry_after(value: str | None, now: float) -> float | None:
    if value is None:
        return None
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return parsedate_to_datetime(value).timestamp() - now
    except (TypeError, ValueError):
        return None


def _bounded(seconds: float) -> float:
    return min(max(seconds, 1.0), WAIT_MAX)


def _message(body: bytes) -> str:
    """GitHub's own short error message, if it sent one."""
    try:
        found = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return ""
    return f": {str(found)[:200]}" if found else ""


def next_cursor(link: str | None) -> str | None:
    """The `cursor` of the `rel="next"` entry of a Link header; only the cursor is kept, never the URL."""
    if not link:
        return None
    for entry in link.split(","):
        target, _, params = entry.partition(";")
        if 'rel="next"' not in params.replace(" ", ""):
            continue
        url = target.strip().removeprefix("<").removesuffix(">")
        found = parse_qs(urlsplit(url).query).get("cursor")
        if found and 0 < len(found[0]) <= CURSOR_MAX:
            return found[0]
    return None
