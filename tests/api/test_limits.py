"""Limits that protect without dropping: failure-only address buckets, trusted proxies, rate classes, 413s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError

from api.app import create_app
from api.clientaddr import ClientAddressMiddleware
from api.ratelimit import TokenBuckets
from switchboard.settings import Settings, parse_networks
from tests.api.test_todos import seed_todos
from tests.conftest import Agent, Stack
from tests.helpers import issue_payload, post_github, token_of
from tests.signing import sign_github

UNKNOWN = "/webhooks/w/" + "0" * 32


def default_buckets(prefix: str) -> TokenBuckets:
    """The bucket map a production process builds for one rate class (make_settings disables them all)."""
    fields = Settings.model_fields
    rate = fields[f"{prefix}_rate_per_second"].default
    burst = fields[f"{prefix}_rate_burst"].default
    return TokenBuckets(rate, burst)


def services_of(stack: Stack) -> Any:
    return stack.app.state.services


def signed(webhook: dict[str, Any], payload: Any, *, secret: str | None = None) -> tuple[str, bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-GitHub-Delivery": str(uuid.uuid4())}
    headers.update(sign_github((secret or webhook["secret"]).encode(), body))
    return f"/webhooks/w/{token_of(webhook['ingest_url'])}", body, headers


# -- the address bucket counts failures only ---------------------------------------------------------------


async def test_a_burst_of_120_signed_deliveries_from_one_address_is_all_accepted(stack: Stack) -> None:
    services_of(stack).ingest_limits = default_buckets("ingest")
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    gate = asyncio.Semaphore(12)

    async def send(n: int) -> int:
        async with gate:
            return (await post_github(stack.http, webhook, issue_payload(number=n), delivery=f"b-{n}")).status_code

    codes = await asyncio.gather(*(send(n) for n in range(120)))
    assert codes.count(202) == 120, sorted(set(codes))
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 120


async def test_a_bad_token_flood_is_throttled_while_a_signed_delivery_from_the_same_address_passes(
    stack: Stack,
) -> None:
    services_of(stack).ingest_limits = TokenBuckets(rate=0.05, burst=5)
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    codes = [(await stack.http.post(UNKNOWN, content=b"{}")).status_code for _ in range(5)]
    assert codes == [404] * 5
    flood = [await stack.http.post(UNKNOWN, content=b"{}") for _ in range(20)]
    assert {r.status_code for r in flood} == {429}
    assert int(flood[-1].headers["retry-after"]) >= 1 and flood[-1].json() == {"error": "rate limit exceeded"}
    # While throttled, a malformed token and a real token with a wrong signature answer exactly as an unknown one.
    malformed = await stack.http.post("/webhooks/w/not-a-token", content=b"{}")
    assert malformed.status_code == 429
    wrong = await post_github(stack.http, webhook, issue_payload(), secret="whsec_" + "0" * 64)
    assert wrong.status_code == 429 and wrong.json() == flood[-1].json()

    # The same address, correctly signed: accepted, routed and stored as usual, however throttled it is.
    for n in range(3):
        ok = await post_github(stack.http, webhook, issue_payload(number=n), delivery=f"ok-{n}")
        assert ok.status_code == 202 and ok.json()["created"] == 1, ok.text
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 3

    # Another address is not throttled by this one's failures.
    other = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=stack.app, client=("192.0.2.44", 4321)), base_url="http://testserver"
    )
    async with other:
        assert (await other.post(UNKNOWN, content=b"{}")).status_code == 404


async def test_a_bad_signature_flood_is_throttled_and_a_verified_delivery_still_passes(stack: Stack) -> None:
    services_of(stack).ingest_limits = TokenBuckets(rate=0.05, burst=4)
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    bad = "whsec_" + "1" * 64
    codes = [(await post_github(stack.http, webhook, issue_payload(), secret=bad)).status_code for _ in range(12)]
    assert codes[:4] == [401] * 4 and set(codes[4:]) == {429}
    missing = await stack.http.post(
        f"/webhooks/w/{token_of(webhook['ingest_url'])}", content=b"{}", headers={"X-GitHub-Event": "issues"}
    )
    assert missing.status_code == 429
    good = await post_github(stack.http, webhook, issue_payload(), delivery="good")
    assert good.status_code == 202 and good.json()["created"] == 1
    assert stack.sql("SELECT count(*) FROM events")[0][0] == 1
    # Verified deliveries spend nothing: the address is exactly as throttled as before, not more.
    assert services_of(stack).ingest_limits.wait("127.0.0.1") > 0


async def test_verified_deliveries_never_spend_the_address_bucket(stack: Stack) -> None:
    services_of(stack).ingest_limits = TokenBuckets(rate=0.05, burst=2)
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    codes = [(await post_github(stack.http, webhook, issue_payload(number=n))).status_code for n in range(6)]
    assert codes == [202] * 6
    # The two failures the burst allows are still there to be answered plainly.
    assert [(await stack.http.post(UNKNOWN, content=b"{}")).status_code for _ in range(3)] == [404, 404, 429]


async def test_oversized_bodies_count_as_failures(stack: Stack) -> None:
    services_of(stack).ingest_limits = TokenBuckets(rate=0.05, burst=2)
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    big = b"x" * (stack.settings.ingest_body_max + 1)
    for _ in range(2):
        resp = await post_github(stack.http, webhook, big)
        assert resp.status_code == 413 and resp.json() == {"error": "payload too large"}
    assert (await stack.http.post(UNKNOWN, content=b"{}")).status_code == 429


# -- the bounded LRU bucket map -----------------------------------------------------------------------------


def test_the_bucket_map_stays_bounded_and_forgets_only_the_stalest() -> None:
    buckets = TokenBuckets(rate=1.0, burst=2, max_keys=100)
    now = 1000.0
    buckets.take("busy", now)
    buckets.take("busy", now)
    assert buckets.take("busy", now) > 0  # empty
    for n in range(1000):
        buckets.spend(f"flood-{n}", now)
        buckets.wait("busy", now)  # a peek does not refresh or store anything
        if n % 50 == 0:
            buckets.take("busy", now)  # the busy key stays recently used
        assert len(buckets) <= 100
    assert len(buckets) == 100
    # No global reset: the busy bucket survived 1000 new keys and is still empty.
    assert buckets.take("busy", now) > 0
    # The oldest flood keys were forgotten one by one, the newest remain.
    assert buckets.wait("flood-999", now) == 0.0  # burst 2, one spent
    buckets.spend("flood-999", now)
    assert buckets.wait("flood-999", now) > 0
    assert buckets.wait("flood-0", now) == 0.0  # forgotten: full again, and not stored by the peek
    assert len(buckets) == 100


def test_wait_does_not_spend_and_spend_never_goes_into_debt() -> None:
    buckets = TokenBuckets(rate=1.0, burst=1)
    assert buckets.wait("a", 0.0) == 0.0 and len(buckets) == 0
    buckets.spend("a", 0.0)
    for _ in range(10):
        buckets.spend("a", 0.0)
    assert buckets.wait("a", 0.0) == pytest.approx(1.0)
    assert buckets.wait("a", 1.0) == 0.0
    assert TokenBuckets(rate=0, burst=1).wait("a") == 0.0  # disabled


# -- trusted proxies ----------------------------------------------------------------------------------------


async def client_address(peer: str, forwarded_for: list[str], trusted: tuple[Any, ...]) -> str:
    """The client address the app sees behind ClientAddressMiddleware (uvicorn's ProxyHeadersMiddleware)."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"][0])

    async def nothing() -> Any:
        raise AssertionError("not read")

    async def ignore(message: Any) -> None:
        pass

    headers = [(b"x-forwarded-for", value.encode()) for value in forwarded_for] + [(b"host", b"api")]
    scope = {"type": "http", "client": (peer, 5555), "headers": headers, "path": "/", "method": "GET"}
    await ClientAddressMiddleware(app, trusted)(scope, nothing, ignore)
    [address] = seen
    return address


async def test_client_address_reads_the_rightmost_untrusted_hop() -> None:
    trusted = parse_networks("10.0.0.0/8, 192.168.1.1, fd00::/8")
    assert await client_address("10.0.0.2", ["203.0.113.5"], trusted) == "203.0.113.5"
    # A client-written hop left of the real one is never believed.
    assert await client_address("10.0.0.2", ["6.6.6.6, 203.0.113.5, 10.0.0.9"], trusted) == "203.0.113.5"
    assert await client_address("10.0.0.2", ["6.6.6.6", "203.0.113.5:443"], trusted) == "203.0.113.5"
    assert await client_address("192.168.1.1", ["6.6.6.6, 192.168.1.1, 203.0.113.5"], trusted) == "203.0.113.5"
    assert await client_address("fd00::1", ["[2001:db8::7]:8080"], trusted) == "2001:db8::7"
    # An IPv4 proxy seen through a dual-stack socket.
    assert await client_address("::ffff:10.0.0.2", ["203.0.113.5"], trusted) == "203.0.113.5"
    assert await client_address("10.0.0.2", ["::ffff:203.0.113.5"], trusted) == "203.0.113.5"
    # Not from a trusted proxy, or no trusted proxies at all: the header is ignored.
    assert await client_address("198.51.100.9", ["203.0.113.5"], trusted) == "198.51.100.9"
    assert await client_address("192.168.1.2", ["203.0.113.5"], trusted) == "192.168.1.2"
    assert await client_address("::ffff:198.51.100.9", ["203.0.113.5"], trusted) == "::ffff:198.51.100.9"
    assert await client_address("127.0.0.1", ["203.0.113.5"], ()) == "127.0.0.1"
    # An unreadable hop falls back to the proxy itself (shared, never spoofed).
    assert await client_address("10.0.0.2", ["203.0.113.5, garbage"], trusted) == "10.0.0.2"
    assert await client_address("10.0.0.2", [""], trusted) == "10.0.0.2"
    # Every hop trusted: the request started inside the trusted network.
    assert await client_address("10.0.0.2", ["10.0.0.7, 10.0.0.8"], trusted) == "10.0.0.7"


def test_a_malformed_trusted_proxy_list_refuses_to_start() -> None:
    with pytest.raises(ValidationError):
        Settings(forwarded_allow_ips="10.0.0.0/8, not-an-ip")
    assert Settings(forwarded_allow_ips="").trusted_proxies() == ()


@contextlib.asynccontextmanager
async def proxied_app(stack: Stack, trusted: str) -> AsyncIterator[Any]:
    """A second API process on the stack's database and task queue, trusting the given proxies."""
    settings = stack.settings.model_copy(update={"forwarded_allow_ips": trusted})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        app.state.services.temporal = stack.temporal
        app.state.services.ingest_limits = TokenBuckets(rate=0.05, burst=2)
        yield app


def client_from(app: Any, peer: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=(peer, 5555)), base_url="http://testserver", timeout=60
    )


async def test_forwarded_for_is_honoured_only_from_a_trusted_proxy(stack: Stack) -> None:
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    async with (
        proxied_app(stack, "10.0.0.0/8") as app,
        client_from(app, "10.1.2.3") as proxy,
        client_from(app, "198.51.100.9") as direct,
    ):
        # Through the proxy: the forwarded client is stored as source_ip.
        url, body, headers = signed(webhook, issue_payload(number=1))
        via = await proxy.post(url, content=body, headers={**headers, "X-Forwarded-For": "6.6.6.6, 203.0.113.5"})
        assert via.status_code == 202, via.text
        # Straight from an untrusted peer: the header is ignored and the peer is stored.
        url, body, headers = signed(webhook, issue_payload(number=2))
        spoof = await direct.post(url, content=body, headers={**headers, "X-Forwarded-For": "203.0.113.5"})
        assert spoof.status_code == 202
        stored = dict(stack.sql("SELECT id, source_ip::text FROM events"))
        assert stored[via.json()["event_id"]].split("/")[0] == "203.0.113.5"
        assert stored[spoof.json()["event_id"]].split("/")[0] == "198.51.100.9"

        # Buckets are keyed by the forwarded client: one producer behind the proxy is throttled, another not.
        bad = {"X-Forwarded-For": "203.0.113.5"}
        assert [(await proxy.post(UNKNOWN, content=b"{}", headers=bad)).status_code for _ in range(3)] == [
            404,
            404,
            429,
        ]
        assert (
            await proxy.post(UNKNOWN, content=b"{}", headers={"X-Forwarded-For": "203.0.113.77"})
        ).status_code == 404
        # The untrusted peer cannot escape its bucket by inventing a new address each time.
        codes = [
            (await direct.post(UNKNOWN, content=b"{}", headers={"X-Forwarded-For": f"203.0.113.{n}"})).status_code
            for n in range(3)
        ]
        assert codes == [404, 404, 429]


async def test_with_no_trusted_proxies_the_header_is_ignored_even_from_localhost(live_stack: Stack) -> None:
    # uvicorn on its own would believe X-Forwarded-For from 127.0.0.1; the served app must not.
    agent = await live_stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    url, body, headers = signed(webhook, issue_payload())
    async with httpx.AsyncClient(base_url=live_stack.base_url, timeout=60) as http:
        resp = await http.post(url, content=body, headers={**headers, "X-Forwarded-For": "203.0.113.5"})
    assert resp.status_code == 202, resp.text
    [(source_ip,)] = live_stack.sql("SELECT source_ip::text FROM events")
    assert source_ip.split("/")[0] == "127.0.0.1"


# -- verb rate classes --------------------------------------------------------------------------------------


async def test_verbs_have_the_rate_class_their_kind_of_work_needs(stack: Stack) -> None:
    from api.verbs import REGISTRY

    authoring = {
        "set_webhook_rules",
        "add_webhook_rule",
        "update_webhook_rule",
        "move_webhook_rule",
        "remove_webhook_rule",
        "test_webhook_rules",
        "backtest_webhook_rules",
        "add_webhook_route",
        "remove_webhook_route",
        "configure_webhook",
        "reroute_webhook_event",
        "reroute_webhook_events",
        "compile_webhook_rule",
        "set_llm_triage",
        "clear_llm_triage",
        "preview_llm_triage",
        "set_webhook_trusted_actors",
        "release_webhook_event",
        "dismiss_webhook_event",
    }
    churn = {"create_webhook", "rotate_webhook", "delete_webhook", "create_schedule", "delete_schedule"}
    # A reconciler is a Temporal Schedule made or removed, like a schedule.
    churn |= {"set_webhook_reconciler", "clear_webhook_reconciler"}
    for name, verb in REGISTRY.items():
        expected = "authoring" if name in authoring else "webhook_admin" if name in churn else "agent"
        assert verb.rate_class == expected, name


async def test_twenty_rule_saves_in_a_row_pass_with_the_default_limits(stack: Stack) -> None:
    services = services_of(stack)
    services.authoring_limits = default_buckets("authoring")
    services.webhook_admin_limits = default_buckets("webhook_admin")
    agent = await stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    rule = {"id": "all", "expr": "true", "action": {"queue": "work"}}
    for n in range(20):
        resp = await agent.call(
            "set_webhook_rules", {"webhook_id": webhook["webhook_id"], "rules": [rule], "params": {"n": n}}
        )
        assert resp.status_code == 200, (n, resp.text)
    dry = await agent.call(
        "test_webhook_rules", {"webhook_id": webhook["webhook_id"], "payload": issue_payload(), "headers": {}}
    )
    assert dry.status_code == 200, dry.text


async def test_create_webhook_churn_is_still_limited(stack: Stack) -> None:
    services_of(stack).webhook_admin_limits = default_buckets("webhook_admin")
    agent = await stack.agent(webhook_max=30)
    started = time.monotonic()
    codes = []
    for _ in range(15):
        resp = await agent.call("create_webhook", {"source_type": "github", "target_queue": "work"})
        codes.append(resp.status_code)
        if resp.status_code == 429:
            assert resp.json()["error"]["code"] == "rate_limited" and int(resp.headers["retry-after"]) >= 1
            break
    assert codes[:5] == [200] * 5 and codes[-1] == 429
    # burst 5, then 1/s: no more successes than the bucket could have refilled.
    assert codes.count(200) <= 5 + int(time.monotonic() - started) + 1


async def test_sixteen_workers_drain_one_lane_endpoint_without_a_429(stack: Stack) -> None:
    services_of(stack).agent_limits = default_buckets("agent")
    agent = await stack.agent()
    seed_todos(stack, agent.endpoint_id, 160)
    refused: list[int] = []

    async def work() -> int:
        worker = Agent(
            stack.http,
            {"endpoint_id": agent.endpoint_id, "agent_id": agent.agent_id, "credential": agent.credential},
            agent.human_id,
        )
        done = 0
        while True:
            resp = await worker.call("claim_next", {})
            if resp.status_code != 200:
                refused.append(resp.status_code)
                return done
            todo = resp.json()["todo"]
            if todo is None:
                return done
            fin = await worker.call("complete", {"todo_id": todo["id"], "result": {}})
            if fin.status_code != 200:
                refused.append(fin.status_code)
            done += 1

    counts = await asyncio.gather(*(work() for _ in range(16)))
    assert refused == [] and sum(counts) == 160


# -- a readable 413 for clients that send everything first --------------------------------------------------


def _urllib_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _raw_post(base: str, path: str, body: bytes) -> bytes:
    """Write the request line, headers and the whole body before reading a byte of the answer."""
    parts = urlsplit(base)
    assert parts.hostname and parts.port
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


async def test_an_oversized_ingest_body_gets_a_readable_413_from_a_client_that_sends_everything_first(
    live_stack: Stack,
) -> None:
    agent = await live_stack.agent()
    webhook = await agent.ok("create_webhook", {"source_type": "github", "target_queue": "work"})
    url = live_stack.base_url + f"/webhooks/w/{token_of(webhook['ingest_url'])}"
    big = b"x" * (live_stack.settings.ingest_body_max * 2)
    status, body = await asyncio.to_thread(_urllib_post, url, big, {"Content-Type": "application/json"})
    assert (status, body) == (413, {"error": "payload too large"})

    raw = await asyncio.to_thread(_raw_post, live_stack.base_url, urlsplit(url).path, big)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert json.loads(payload) == {"error": "payload too large"}
    assert live_stack.sql("SELECT count(*) FROM events")[0][0] == 0


async def test_an_oversized_verb_body_gets_a_readable_413_from_a_client_that_sends_everything_first(
    live_stack: Stack,
) -> None:
    agent = await live_stack.agent()
    big = b"x" * (live_stack.settings.agent_body_max * 2)
    status, body = await asyncio.to_thread(
        _urllib_post,
        live_stack.base_url + "/v1/claim",
        big,
        {"Authorization": f"Bearer {agent.credential}", "Content-Type": "application/json"},
    )
    assert status == 413 and body["error"]["code"] == "too_large"
