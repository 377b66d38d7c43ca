"""LlmStore: provider keys sealed at rest and never listed; budgets counted atomically, all windows or none."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import psycopg
import pytest

from store.crypto import SecretBox
from store.db import Pool, open_pool
from store.errors import InvalidArgument, NotFound
from store.llm import Ceilings, LlmStore
from store.webhooks import WebhookStore

KEY = "sk-very-secret-" + "x" * 20


@pytest.fixture
async def llm(database_url: str) -> AsyncIterator[LlmStore]:
    pool: Pool = await open_pool(database_url, max_size=8)
    box = SecretBox(secrets.token_hex(32))
    try:
        yield LlmStore(pool, box, WebhookStore(pool, box))
    finally:
        await pool.close()


async def test_provider_key_sealed_at_rest_and_never_listed(llm: LlmStore, database_url: str) -> None:
    info = await llm.set_provider("openai", "https://api.example.test/v1/", KEY, 7.5, ["gpt-x"])
    assert info.has_api_key and info.base_url == "https://api.example.test/v1"
    assert KEY not in info.model_dump_json()
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT api_key_ciphertext::text, row_to_json(p)::text FROM llm_providers p").fetchone()
    assert row is not None and KEY not in row[0] and KEY not in row[1]
    listed = await llm.list_providers()
    assert [p.name for p in listed] == ["openai"]
    assert KEY not in "".join(p.model_dump_json() for p in listed)
    opened = await llm.provider("openai")
    assert opened is not None and opened.api_key == KEY and opened.models == ("gpt-x",)
    assert KEY not in repr(opened)
    # Replacing without a key keeps the sealed one; a key sealed for one name does not open under another.
    await llm.set_provider("openai", "https://api.example.test/v1", None, 5, ["gpt-x", "gpt-y"])
    again = await llm.provider("openai")
    assert again is not None and again.api_key == KEY
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO llm_providers (name, base_url, api_key_ciphertext, timeout_seconds)"
            " SELECT 'copied', base_url, api_key_ciphertext, 5 FROM llm_providers WHERE name = 'openai'"
        )
    assert await llm.provider("copied") is None


async def test_provider_validation_and_delete(llm: LlmStore) -> None:
    for name, url in [("Bad Name", "http://x"), ("ok", "ftp://x"), ("ok", "http://u:p@x")]:
        with pytest.raises(InvalidArgument):
            await llm.set_provider(name, url, None, 5, [])
    assert await llm.provider("embedded") is None  # no built-in provider: only registered rows exist
    await llm.set_provider("local", "http://127.0.0.1:1/v1", None, 5, [])
    await llm.delete_provider("local")
    assert await llm.provider("local") is None
    with pytest.raises(NotFound):
        await llm.delete_provider("local")


async def test_budget_counts_every_window_or_none(llm: LlmStore) -> None:
    ceilings = Ceilings(per_minute=3, per_day=100, timeout_seconds=30)

    async def take(webhook: str, per_minute: int = 2, per_day: int = 100, endpoint: str = "ep_1") -> str | None:
        return await llm.take_budget(endpoint, webhook, per_minute=per_minute, per_day=per_day, ceilings=ceilings)

    assert await take("wh_a") is None
    assert await take("wh_a") is None
    assert await take("wh_a") == "webhook:minute"
    # The endpoint's total (ceiling 3 per minute) spans its webhooks; the refused take above counted nothing.
    assert await take("wh_b") is None
    assert await take("wh_b") == "endpoint:minute"
    assert await take("wh_c", per_day=0, endpoint="ep_9") == "webhook:day"


async def test_concurrent_takes_never_overspend(llm: LlmStore) -> None:
    ceilings = Ceilings(per_minute=1000, per_day=1000, timeout_seconds=30)
    results = await asyncio.gather(
        *(llm.take_budget("ep_2", "wh_x", per_minute=5, per_day=1000, ceilings=ceilings) for _ in range(20))
    )
    assert results.count(None) == 5
    assert set(results) == {None, "webhook:minute"}
