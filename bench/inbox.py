"""Accept first, measured: answer time when Temporal is unreachable or frozen, and how fast relays drain the inbox.

Runs an embedded PostgreSQL and a Temporal dev server in a scratch folder; the API runs in-process (ASGI).
    .venv/bin/python bench/inbox.py [--deliveries 200] [--rows 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from api.app import create_app
from cli.embedded import search_attribute_args, start_postgres, temporal_cli
from routing.delivery import DeliveryInput, workflow_id_for
from runtime.relay import InboxRelay
from store.commits import CommitStore
from store.db import migrate, open_pool
from store.inbox import InboxStore
from switchboard.settings import Settings
from tests.signing import sign_github


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def dev_server_pid(target: str) -> int:
    port = target.rsplit(":", 1)[1].encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"start-dev" in args and port in args:
                return int(proc.name)
    raise RuntimeError("dev server not found")


async def post(http: httpx.AsyncClient, webhook: dict[str, str], n: int) -> tuple[int, float]:
    body = json.dumps({"action": "opened", "issue": {"number": n, "title": "t"}}).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-GitHub-Delivery": f"b-{n}"}
    headers.update(sign_github(webhook["secret"].encode(), body))
    started = time.monotonic()
    resp = await http.post(f"/webhooks/w/{webhook['ingest_url'].rsplit('/', 1)[-1]}", content=body, headers=headers)
    return resp.status_code, time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deliveries", type=int, default=200)
    parser.add_argument("--rows", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sb-inbox-") as tmp:
        server, url = start_postgres(Path(tmp) / "pg", "bench")
        env = await WorkflowEnvironment.start_local(
            data_converter=pydantic_data_converter,
            dev_server_existing_path=temporal_cli(),
            dev_server_extra_args=search_attribute_args(),
            dev_server_startup_timeout=timedelta(seconds=60),
            ui=False,
        )
        try:
            migrate(url)
            settings = Settings(
                home=Path(tmp) / "home",
                database_url=url,
                temporal_address=env.client.service_client.config.target_host,
                task_queue=f"bench-{uuid.uuid4().hex[:6]}",
                admin_token="sba_" + secrets.token_hex(8),
                secret_key=secrets.token_hex(32),
                ingest_rate_per_second=0,
                agent_rate_per_second=0,
                webhook_admin_rate_per_second=0,
            )
            app = create_app(settings, temporal=env.client)
            async with (
                app.router.lifespan_context(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=30) as http,
            ):
                auth = {"Authorization": f"Bearer {settings.admin_token}"}
                human = (await http.post("/admin/v1/create_human", json={"name": "b"}, headers=auth)).json()
                agent = (
                    await http.post(
                        "/admin/v1/create_agent", json={"human_id": human["human_id"], "name": "b"}, headers=auth
                    )
                ).json()
                vended = (
                    await http.post(
                        "/admin/v1/vend_endpoint",
                        json={
                            "agent_id": agent["agent_id"],
                            "queues": ["work"],
                            "verbs": ["create_webhook"],
                            "webhook_max": 5,
                            "webhook_source_types": ["github"],
                            "webhook_queues": ["work"],
                        },
                        headers=auth,
                    )
                ).json()
                webhook = (
                    await http.post(
                        "/v1/create_webhook",
                        json={"source_type": "github", "target_queue": "work"},
                        headers={"Authorization": f"Bearer {vended['credential']}"},
                    )
                ).json()
                svc = app.state.services

                # 1. Temporal unreachable: every verified delivery is answered 202 pending from the inbox.
                svc.temporal = await Client.connect("127.0.0.1:1", data_converter=pydantic_data_converter, lazy=True)
                sem = asyncio.Semaphore(8)

                async def one(n: int) -> tuple[int, float]:
                    async with sem:
                        return await post(http, webhook, n)

                results = await asyncio.gather(*(one(n) for n in range(args.deliveries)))
                times = [t for _, t in results]
                codes = {c for c, _ in results}
                print(
                    f"temporal unreachable  deliveries={args.deliveries} concurrency=8 codes={sorted(codes)}"
                    f" p50={statistics.median(times) * 1000:.0f}ms p95={pct(times, 0.95) * 1000:.0f}ms"
                    f" max={max(times) * 1000:.0f}ms"
                )

                # 2. Temporal frozen (SIGSTOP): the answer comes at the start deadline, not after a hang.
                svc.temporal = env.client
                svc.admission.start_ok()
                pid = dev_server_pid(env.client.service_client.config.target_host)
                os.kill(pid, signal.SIGSTOP)
                try:
                    frozen = [await post(http, webhook, 100_000 + n) for n in range(3)]
                finally:
                    os.kill(pid, signal.SIGCONT)
                print(
                    "temporal frozen       "
                    + " ".join(f"{code}:{took * 1000:.0f}ms" for code, took in frozen)
                    + " (then straight to the inbox during the backoff)"
                )

            # 3. Relay drain: start throughput from the inbox into Temporal (no worker: starts only).
            pool = await open_pool(url, max_size=12)
            try:
                inbox = InboxStore(pool)
                async with pool.connection() as conn:
                    await conn.execute("DELETE FROM delivery_inbox")
                for relays in (1, 2):
                    for n in range(args.rows):
                        delivery = DeliveryInput(
                            webhook_id=webhook["webhook_id"],
                            endpoint_id=vended["endpoint_id"],
                            source="github",
                            kind="issues",
                            external_id=f"{webhook['webhook_id']}:drain-{relays}-{n}",
                            trust_mode="signed",
                            verified=True,
                            verify_detail="ok",
                            content_type="application/json",
                            headers={},
                            body=b'{"n": %d}' % n,
                            source_ip=None,
                            received_at=datetime.now(UTC).isoformat(),
                        )
                        await inbox.put(
                            workflow_id_for(delivery.webhook_id, delivery.external_id), delivery, "admission"
                        )
                    quiet = settings.model_copy(update={"relay_log_seconds": 3600.0, "eager_start": False})
                    started = time.monotonic()
                    tasks = [
                        asyncio.create_task(InboxRelay(env.client, inbox, CommitStore(inbox.pool), quiet).run())
                        for _ in range(relays)
                    ]
                    while True:  # polling the database
                        if not (await inbox.stats()).depth:
                            break
                        await asyncio.sleep(0.05)
                    took = time.monotonic() - started
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    print(
                        f"relay drain           relays={relays} rows={args.rows} {took:.2f}s {args.rows / took:.0f} starts/s"
                    )
            finally:
                await pool.close()
        finally:
            await env.shutdown()
            server.stop()


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main())
