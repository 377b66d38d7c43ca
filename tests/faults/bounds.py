"""The client-bound rows: slow clients, producers hanging up, hostile stored bodies, hostile verb calls.

Each row runs under the usual load and adds its bound, measured from outside (the answers, /metrics, the API's own
log) and checked (`Outcome.bound_held`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from api.connections import FD_RESERVE
from api.verbs import REGISTRY
from routing.text import MAX_JSON_DEPTH
from switchboard.settings import Settings
from tests.faults.counts import Counts
from tests.faults.processes import Proc
from tests.faults.producers import Load, issue_body, post_delivery
from tests.faults.scenarios import under_load
from tests.faults.stack import FaultStack
from tests.faults.tally import Outcome
from tests.signing import sign_github

# --------------------------------------------------------------------------------------------- client bounds

BOUND = Settings.model_fields
HEALTH_ADDRESS = "127.0.0.3"  # the orchestrator's health checks come from here, never from a flooding address


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of a metric's samples in a Prometheus text page whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total


async def scrape(base: str) -> str:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=HEALTH_ADDRESS)) as http:
        return (await http.get(f"{base}/metrics", timeout=10)).text


def _answer_status(data: bytes) -> str:
    """`429`, `408`, … from the start of an HTTP answer; `closed` for none."""
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "closed"


def _code(resp: httpx.Response) -> str:
    """An answer's error code, `-` for a success, `not JSON` for an answer that is not the API's error body."""
    if resp.status_code < 400:
        return "-"
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "not JSON"


def log_lines(path: Path, offset: int) -> list[str]:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace").splitlines()


class _SlowClient(asyncio.Protocol):
    """One connection that is fed its request a byte at a time (by slow_clients' ticker) and records the answer."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.started = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self.answer = b""
        self.sent = 0
        self.error: BaseException | None = None
        self.life: float | None = None  # seconds from connecting to the server closing it
        self.abandoned = False  # still open when the flood ended: closed by us, not by the server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.answer += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.error = exc
        self.life = time.monotonic() - self.started

    def verdict(self) -> str:
        if self.abandoned or self.life is None:
            return "held past its head"
        if self.answer:
            return _answer_status(self.answer)
        return "reset" if self.error is not None else "closed"


def _restart(stack: FaultStack, api: Proc, nofile: int | None) -> None:
    """Restart an API process with this descriptor limit (None: the campaign's own)."""
    api.stop()
    api.nofile = nofile
    stack.start_api(api)


async def slow_clients(stack: FaultStack, counts: Counts) -> Outcome:
    """Connections that send one byte a second and never a whole request head, under load: `slow_one_address`
    from one address, `slow_spread` more over `slow_addresses` others; with `slow_nofile`, the API restarted with
    that descriptor limit first, so the flood outnumbers its descriptors (the full run). /healthz probed from
    another address on a new connection every half second, during and after. Bound: the per-address cap (the rest
    refused at once), the global cap (the oldest waiting connections evicted), every slow connection cut at the
    head deadline, no `accept()` out of descriptors, /healthz answered 200 every time."""
    hook = await asyncio.to_thread(stack.hook, "slow-clients")
    api = stack.apis[0]
    port, base = stack.api_ports[api.name], stack.base(api)
    offset = api.log.stat().st_size
    head_s = float(BOUND["http_head_timeout_seconds"].default)
    per_address = int(BOUND["http_max_connections_per_address"].default)
    total = int(BOUND["http_max_connections"].default)
    clients: list[_SlowClient] = []
    unconnected: Counter[str] = Counter()
    health: list[tuple[int | None, float]] = []
    open_max = 0.0
    stop = asyncio.Event()
    request = b"POST /webhooks/w/0123456789abcdef0123456789abcdef HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100

    async def connect(group: str, source: str) -> None:
        loop = asyncio.get_running_loop()
        client = _SlowClient(group)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: client, "127.0.0.1", port, local_addr=(source, 0)), 10
            )
        except (OSError, TimeoutError):
            unconnected[group] += 1
            return
        clients.append(client)

    async def tick() -> None:
        # One byte a second to every connection still open: one timer for all of them.
        while not stop.is_set():
            for client in clients:
                if client.life is None and client.transport is not None and client.sent < len(request):
                    client.transport.write(request[client.sent : client.sent + 1])
                    client.sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def probe() -> None:
        nonlocal open_max
        while not stop.is_set():
            # A new connection each time, as an orchestrator's probe opens: it must get in during the flood.
            transport = httpx.AsyncHTTPTransport(local_address=HEALTH_ADDRESS)
            async with httpx.AsyncClient(transport=transport, timeout=5) as http:
                t0 = time.perf_counter()
                try:
                    status: int | None = (await http.get(f"{base}/healthz")).status_code
                    took = time.perf_counter() - t0
                    page = (await http.get(f"{base}/metrics")).text
                    open_max = max(open_max, metric(page, "switchboard_http_connections"))
                except httpx.HTTPError:
                    status, took = None, time.perf_counter() - t0
                health.append((status, took))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        ticking, probing = asyncio.create_task(tick()), asyncio.create_task(probe())
        sources = [("one", "127.0.0.2")] * counts.slow_one_address + [
            ("spread", f"127.0.1.{1 + i % counts.slow_addresses}") for i in range(counts.slow_spread)
        ]
        for i in range(0, len(sources), 500):  # opened in bursts the listen backlog takes
            await asyncio.gather(*(connect(group, source) for group, source in sources[i : i + 500]))
        deadline = time.monotonic() + head_s + 30
        while any(c.life is None for c in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        ended = time.time()
        await asyncio.sleep(3.0)  # /healthz after the flood: it must not stay broken
        stop.set()
        await asyncio.gather(ticking, probing)
        for client in clients:
            if client.life is None and client.transport is not None:
                client.abandoned = True
                client.transport.close()
        return [(began, ended)]

    name = f"slow clients ×{counts.slow_one_address + counts.slow_spread}"
    if counts.slow_nofile is not None:
        # As on a host with a small descriptor limit: the flood has more connections than the process descriptors.
        name += f", {counts.slow_nofile} fds"
        total = min(total, counts.slow_nofile - FD_RESERVE)
        await asyncio.to_thread(_restart, stack, api, counts.slow_nofile)
        offset = api.log.stat().st_size
    try:
        out = await under_load(stack, hook, counts, name, fault)
    finally:
        if counts.slow_nofile is not None:
            await asyncio.to_thread(_restart, stack, api, None)
    verdicts = Counter(c.verdict() for c in clients) + Counter({"no connection": sum(unconnected.values())})
    refused_one = sum(1 for c in clients if c.group == "one" and c.verdict() == "429")
    held_one = sum(1 for c in clients if c.group == "one") - refused_one
    healthy = sum(1 for status, _ in health if status == 200)
    slowest_health = max((took for _, took in health), default=0.0)
    longest = max((c.life for c in clients if c.life is not None), default=0.0)
    lines = log_lines(api.log, offset)
    exhausted = sum("out of system resource" in line for line in lines)
    served = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("message") == "request" and entry.get("path") == "/healthz":
                served.append(float(entry.get("ms", 0)))
    out.bound = (
        f"one address held {held_one} (cap {per_address}), refused {refused_one} at once; at most {open_max:.0f}"
        f" open in all (cap {total}); longest slow connection {longest:.1f} s (head deadline {head_s:g} s);"
        f" accept() out of descriptors ×{exhausted}; /healthz 200 ×{healthy}/{len(health)} (slowest"
        f" {slowest_health:.2f} s at the client, {max(served, default=0) / 1000:.2f} s in the API); answers"
        f" {', '.join(f'{k} ×{v}' for k, v in sorted(verdicts.items()))}"
    )
    out.bound_held = (
        held_one <= per_address
        and open_max <= total
        and longest <= head_s + 5.0
        and "held past its head" not in verdicts
        and exhausted == 0
        and healthy == len(health) > 0
    )
    return out


async def producer_hangups(stack: FaultStack, counts: Counts) -> Outcome:
    """`hangups` producers send a signed delivery's head and half its body, then hang up, under load. Bound: each
    is counted as a disconnect (ingest status 499), none as a 500, and the API logs no ERROR and nothing but JSON."""
    hook = await asyncio.to_thread(stack.hook, "hang-ups")
    api = stack.apis[0]
    port, base = stack.api_ports[api.name], stack.base(api)
    log = api.log
    offset = log.stat().st_size
    before = await scrape(base)

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        for n in range(counts.hangups):
            delivery = str(uuid.uuid4())
            body = issue_body(n, delivery)
            headers = {
                "Host": "x",
                "Content-Type": "application/json",
                "Content-Length": str(len(body)),
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": delivery,
                **sign_github(hook.secret, body),
            }
            head = f"POST /webhooks/w/{hook.token} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            _, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.4", 0))
            writer.write(head.encode() + b"\r\n" + body[: len(body) // 2])
            await writer.drain()
            writer.close()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, f"producers hang up ×{counts.hangups}", fault)
    after = await scrape(base)

    def delta(status: str) -> int:
        name, labels = "switchboard_ingest_requests_total", {"status": status}
        return round(metric(after, name, labels) - metric(before, name, labels))

    lines = log_lines(log, offset)
    errors = non_json = 0
    for line in lines:
        try:
            errors += json.loads(line).get("level") in ("ERROR", "CRITICAL")
        except ValueError:
            non_json += 1
    disconnects, failures = delta("499"), delta("500")
    out.bound = (
        f"{counts.hangups} hang-ups: {disconnects} × 499, {failures} × 500; API log: {errors} ERROR lines,"
        f" {non_json} of {len(lines)} lines not JSON"
    )
    out.bound_held = disconnects == counts.hangups and failures == 0 and errors == 0 and non_json == 0
    return out


def _hostile_bodies() -> dict[str, bytes]:
    """Bodies a producer may sign: nested past every parser's limit, past pydantic's, just past ours; a lone
    surrogate escape."""
    deep = MAX_JSON_DEPTH + 1

    def nested(depth: int) -> bytes:
        return b'{"action": "opened", "x": ' + b"[" * depth + b"1" + b"]" * depth + b"}"

    return {
        "nested-5000": nested(5000),
        "nested-300": nested(300),
        f"nested-{deep}": nested(deep - 1),
        "lone-surrogate": b'{"action": "opened", "issue": {"number": 1, "title": "\\ud800"}}',
    }


async def hostile_bodies(stack: FaultStack, counts: Counts) -> Outcome:
    """Signed deliveries with hostile bodies among the load, each then read back. Bound: every one accepted and
    routed, and every stored event and todo answers its read (200)."""
    verbs = ["create_webhook", "claim_next", "get_webhook_event", "get_todo", "list_webhook_events"]
    hook = await asyncio.to_thread(stack.hook, "hostile-bodies", verbs)
    base = stack.base(stack.apis[0])
    sent: list[str] = []

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(counts.hostile_rounds):
                for name, body in _hostile_bodies().items():
                    delivery = f"{name}-{uuid.uuid4().hex[:12]}"
                    load.answers.append(await post_delivery(http, base, 0, hook, delivery, body))
                    sent.append(delivery)
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, f"hostile bodies ×{counts.hostile_rounds * 4}", fault)
    rows = await asyncio.to_thread(
        stack.sql,
        "SELECT e.id, t.id FROM events e LEFT JOIN todos t ON t.event_id = e.id WHERE e.external_id = ANY(%s)",
        [f"{hook.webhook_id}:{d}" for d in sent],
    )
    statuses: Counter[str] = Counter()
    auth = {"Authorization": f"Bearer {hook.credential}"}
    async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
        for event_id, todo_id in rows:
            for what, verb, body in (
                ("event", "get_webhook_event", {"event_id": event_id}),
                ("todo", "get_todo", {"todo_id": todo_id}),
            ):
                try:
                    statuses[f"{what} {(await http.post(f'/v1/{verb}', json=body)).status_code}"] += 1
                except httpx.HTTPError as exc:
                    statuses[f"{what} no answer ({type(exc).__name__})"] += 1
    out.bound = (
        f"{len(sent)} hostile bodies (nested 5000, 300 and {MAX_JSON_DEPTH + 1} deep, a lone surrogate):"
        f" {len(rows)} stored; reads {', '.join(f'{k} ×{v}' for k, v in sorted(statuses.items()))}"
    )
    out.bound_held = len(rows) == len(sent) and statuses == Counter({"event 200": len(sent), "todo 200": len(sent)})
    return out


async def hostile_calls(stack: FaultStack, counts: Counts) -> Outcome:
    """An endpoint's own hostile verb calls among the load on its webhook: arguments nested 300 and 5000 deep (the
    writes that used to be applied and then made every read fail, rule params among them, which held every
    delivery in load_grant), bodies that are not UTF-8, integers of 5,000 digits, a string for a boolean, a GET on
    a verb. Bound: each answered as docs/api.md says, never 5xx, every read after it 200, deliveries still routed."""
    hook = await asyncio.to_thread(stack.hook, "hostile-calls", list(REGISTRY))
    base = stack.base(stack.apis[0])
    answers: list[tuple[str, bool]] = []
    sweep: Counter[str] = Counter()
    deep = json.loads("[" * 300 + "1" + "]" * 300)
    very_deep = b'{"x": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}"

    async def expect(
        what: str, call: Awaitable[httpx.Response], status: int, code: str | None = None
    ) -> httpx.Response | None:
        try:
            resp = await call
        except httpx.HTTPError:
            answers.append((what, False))
            return None
        answers.append((what, resp.status_code == status and (code is None or _code(resp) == code)))
        return resp

    async def fault(load: Load) -> list[tuple[float, float]]:
        began = time.time()
        auth = {"Authorization": f"Bearer {hook.credential}"}
        w = hook.webhook_id
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            rules = {"webhook_id": w, "rules": [], "params": {"deep": deep}}
            await expect("deep rule params", http.post("/v1/set_webhook_rules", json=rules), 422, "too_deep")
            await expect("rules read", http.post("/v1/list_webhook_rules", json={"webhook_id": w}), 200)
            await load.until(counts.senders)
            claimed = await expect("claim", http.post("/v1/claim_next", json={}), 200)
            todo = claimed.json().get("todo") if claimed is not None else None
            if todo:
                done = {"todo_id": todo["id"], "result": deep}
                await expect("deep result", http.post("/v1/complete", json=done), 422, "too_deep")
                await expect("todo read", http.post("/v1/get_todo", json={"todo_id": todo["id"]}), 200)
            schedule = {"cron": "@daily", "webhook_id": w, "title": "t", "payload": {"deep": deep}}
            await expect("deep schedule", http.post("/v1/create_schedule", json=schedule), 422, "too_deep")
            listed = await expect("schedules read", http.post("/v1/list_schedules", json={}), 200)
            answers.append(("no schedule made", listed is not None and listed.json().get("schedules") == []))
            await expect("not UTF-8", http.post("/v1/list_todos", content=b"\xff\xfe"), 422, "invalid_argument")
            digits = b'{"limit": ' + b"9" * 5000 + b"}"
            await expect("5,000 digits", http.post("/v1/list_todos", content=digits), 422, "invalid_argument")
            rotate = {"webhook_id": w, "new_ingest_token": "true"}
            await expect("string boolean", http.post("/v1/rotate_webhook", json=rotate), 422, "invalid_argument")
            got = await expect("GET on a verb", http.get("/v1/claim"), 405, "method_not_allowed")
            answers.append(("Allow on a 405", got is not None and got.headers.get("allow") == "POST"))
            for name in REGISTRY:
                try:
                    resp = await http.post(f"/v1/{name}", content=very_deep)
                    sweep[f"{resp.status_code} {_code(resp)}"] += 1
                except httpx.HTTPError as exc:
                    sweep[f"no answer ({type(exc).__name__})"] += 1
        return [(began, time.time())]

    out = await under_load(stack, hook, counts, "hostile verb calls", fault)
    wrong = [what for what, ok in answers if not ok]
    failures = sum(v for k, v in sweep.items() if k.startswith("5"))
    out.bound = (
        f"{len(answers)} checks, {len(answers) - len(wrong)} as documented"
        + (f" (not: {', '.join(wrong)})" if wrong else "")
        + f"; every verb with a body 5000 deep: {', '.join(f'{k} ×{v}' for k, v in sorted(sweep.items()))}"
    )
    out.bound_held = not wrong and failures == 0 and set(sweep) <= {"422 too_deep", "429 rate_limited"}
    return out
