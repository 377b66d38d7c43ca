"""LLM triage state: the operator's provider registry (keys sealed at rest), per-webhook triage and its budgets."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidTag
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from routing.models import Grant, TriageConfig, TriageQueue
from routing.rules import check_action_granted
from store.crypto import SecretBox
from store.db import Pool
from store.errors import Forbidden, InvalidArgument, NotFound, translates_errors
from store.models import Caller
from store.rules import UNKNOWN_WEBHOOK
from store.webhooks import WebhookStore
from switchboard.llm import Provider

PROVIDER_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
MAX_MODELS = 32
MAX_TRIAGE_QUEUES = 32
MAX_DESCRIPTION_CHARS = 500

_TRIAGE_COLUMNS = (
    "provider, model, queues, threshold, per_minute, per_day, include_payload, include_payload_set_at,"
    " include_payload_set_by, timeout_seconds"
)

_UPSERT_TRIAGE = """
INSERT INTO webhook_llm_triage (webhook_id, provider, model, queues, threshold, per_minute, per_day,
    include_payload, include_payload_set_at, include_payload_set_by, timeout_seconds, updated_by)
VALUES (%(webhook)s, %(provider)s, %(model)s, %(queues)s, %(threshold)s, %(per_minute)s, %(per_day)s,
    %(include_payload)s, CASE WHEN %(include_payload)s THEN now() END,
    CASE WHEN %(include_payload)s THEN %(by)s END, %(timeout)s, %(by)s)
ON CONFLICT (webhook_id) DO UPDATE SET
    provider = excluded.provider, model = excluded.model, queues = excluded.queues,
    threshold = excluded.threshold, per_minute = excluded.per_minute, per_day = excluded.per_day,
    include_payload = excluded.include_payload,
    -- The egress record keeps the moment full payload text was first enabled, until it is turned off.
    include_payload_set_at = CASE WHEN NOT excluded.include_payload THEN NULL
        WHEN webhook_llm_triage.include_payload THEN webhook_llm_triage.include_payload_set_at
        ELSE now() END,
    include_payload_set_by = CASE WHEN NOT excluded.include_payload THEN NULL
        WHEN webhook_llm_triage.include_payload THEN webhook_llm_triage.include_payload_set_by
        ELSE excluded.updated_by END,
    timeout_seconds = excluded.timeout_seconds, updated_by = excluded.updated_by, updated_at = now()
"""


class ProviderInfo(BaseModel):
    """A provider as listed: never its key, only whether one is set."""

    name: str
    base_url: str
    timeout_seconds: float
    models: list[str]
    has_api_key: bool
    webhooks: int = 0  # webhooks whose triage names it


@dataclass(frozen=True)
class Ceilings:
    """The operator's caps on a triage stage (settings): budgets per endpoint and the longest call."""

    per_minute: int
    per_day: int
    timeout_seconds: float


class TriageSetting(BaseModel):
    """set_llm_triage's configuration, before validation."""

    provider: str
    model: str
    queues: list[TriageQueue]
    threshold: float
    per_minute: int
    per_day: int
    include_payload: bool = False
    timeout_seconds: float | None = None


def provider_context(name: str) -> str:
    """Associated data sealing a provider's key: a key copied to another provider's row will not open."""
    return f"llm-provider:{name}"


def check_base_url(base_url: str) -> str:
    """An http(s) URL with a host, without credentials or a query (keys go in api_key, never in the URL)."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("base_url must be an http:// or https:// URL with a host")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidArgument("base_url must not carry credentials, a query or a fragment")
    return base_url.rstrip("/")


def _triage_of(row: dict[str, Any]) -> TriageConfig:
    set_at = row["include_payload_set_at"]
    return TriageConfig(
        provider=row["provider"],
        model=row["model"],
        queues=[TriageQueue.model_validate(q) for q in row["queues"]],
        threshold=row["threshold"],
        per_minute=row["per_minute"],
        per_day=row["per_day"],
        include_payload=row["include_payload"],
        include_payload_set_at=set_at.isoformat() if isinstance(set_at, datetime) else None,
        include_payload_set_by=row["include_payload_set_by"],
        timeout_seconds=row["timeout_seconds"],
    )


def check_triage_queues(queues: list[TriageQueue], grant: Grant) -> list[TriageQueue]:
    """The triage queues, each granted exactly as a rule action must be; not_granted surfaces as forbidden."""
    if not queues:
        raise InvalidArgument("queues must name at least one queue")
    if len(queues) > MAX_TRIAGE_QUEUES:
        raise InvalidArgument(f"{len(queues)} queues; the limit is {MAX_TRIAGE_QUEUES}")
    names = [q.queue for q in queues]
    if len(set(names)) != len(names):
        raise InvalidArgument("queues must not repeat")
    out: list[TriageQueue] = []
    for q in queues:
        if not q.queue:
            raise InvalidArgument("a queue name must not be empty")
        if len(q.description) > MAX_DESCRIPTION_CHARS:
            raise InvalidArgument(f"the description of {q.queue} is over {MAX_DESCRIPTION_CHARS} characters")
        # The same check a rule action's queue passes at save (routing.rules), so the two cannot drift.
        reason = check_action_granted({"queue": q.queue}, grant)
        if reason is not None:
            raise Forbidden(f"triage queue {q.queue}: {reason}")
        out.append(TriageQueue(queue=q.queue, description=q.description.strip()))
    return out


class LlmStore:
    """Providers (keys sealed with the server key), each webhook's triage stage, and the budget counters."""

    def __init__(self, pool: Pool, box: SecretBox, webhooks: WebhookStore) -> None:
        self.pool = pool
        self.box = box
        self.webhooks = webhooks

    # --- the provider registry (operator) ---

    @translates_errors
    async def set_provider(
        self, name: str, base_url: str, api_key: str | None, timeout_seconds: float, models: list[str]
    ) -> ProviderInfo:
        """Create or replace a provider; a key given is sealed, a key omitted keeps the stored one."""
        if not PROVIDER_NAME.match(name):
            raise InvalidArgument("name must be 1-63 lowercase letters, digits, '.', '_' or '-'")
        url = check_base_url(base_url)
        if len(models) > MAX_MODELS or any(not m or len(m) > 200 for m in models) or len(set(models)) != len(models):
            raise InvalidArgument(f"models must be up to {MAX_MODELS} distinct, non-empty names")
        sealed = self.box.seal(api_key, provider_context(name)) if api_key else None
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO llm_providers (name, base_url, api_key_ciphertext, timeout_seconds, models)"
                " VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET base_url = excluded.base_url,"
                " api_key_ciphertext = coalesce(excluded.api_key_ciphertext, llm_providers.api_key_ciphertext),"
                " timeout_seconds = excluded.timeout_seconds, models = excluded.models, updated_at = now()"
                " RETURNING name, base_url, timeout_seconds, models, api_key_ciphertext IS NOT NULL AS has_api_key",
                (name, url, sealed, timeout_seconds, models),
            )
            row = await cur.fetchone()
        assert row is not None
        return ProviderInfo(**row)

    @translates_errors
    async def list_providers(self) -> list[ProviderInfo]:
        """Every provider, with how many webhooks use it; never a key."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT p.name, p.base_url, p.timeout_seconds, p.models,"
                " p.api_key_ciphertext IS NOT NULL AS has_api_key,"
                " (SELECT count(*) FROM webhook_llm_triage t WHERE t.provider = p.name)::int AS webhooks"
                " FROM llm_providers p ORDER BY p.name"
            )
            rows = await cur.fetchall()
        return [ProviderInfo(**r) for r in rows]

    @translates_errors
    async def delete_provider(self, name: str) -> None:
        """Remove a provider at once; triage naming it then takes the default (llm_error) until reconfigured."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("DELETE FROM llm_providers WHERE name = %s RETURNING name", (name,))
            if await cur.fetchone() is None:
                raise NotFound("unknown provider")

    @translates_errors
    async def provider(self, name: str) -> Provider | None:
        """The provider with its key opened; None when unknown (or its key no longer opens)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT name, base_url, api_key_ciphertext, timeout_seconds, models FROM llm_providers WHERE name = %s",
                (name,),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        sealed = row["api_key_ciphertext"]
        api_key: str | None = None
        if sealed is not None:
            try:
                api_key = self.box.open(bytes(sealed), provider_context(name))
            except (InvalidTag, ValueError):
                # Sealed under another server key, or damaged: no call is made with a key that is not this one.
                return None
        return Provider(
            name=row["name"],
            base_url=row["base_url"],
            api_key=api_key,
            timeout_seconds=row["timeout_seconds"],
            models=tuple(row["models"]),
        )

    # --- per-webhook triage (owner) ---

    async def _owned_grant(self, conn: AsyncConnection[DictRow], caller: Caller, webhook_id: str) -> Grant:
        """The grant of a webhook the caller's human owns; unknown and foreign are the same not_found."""
        grant = await self.webhooks.grant_on(conn, webhook_id)
        if grant is None or grant.human_id != caller.human_id:
            raise NotFound(UNKNOWN_WEBHOOK)
        return grant

    async def _check_setting(self, request: TriageSetting, ceilings: Ceilings) -> None:
        """A triage stage's settings within the operator's ceilings, naming a known provider and one of its models."""
        if not 0 <= request.threshold <= 1:
            raise InvalidArgument("threshold must be between 0 and 1")
        if request.per_minute < 0 or request.per_day < 0:
            raise InvalidArgument("per_minute and per_day must not be negative")
        if request.per_minute > ceilings.per_minute or request.per_day > ceilings.per_day:
            raise InvalidArgument(
                f"budgets over the operator ceiling (per_minute <= {ceilings.per_minute},"
                f" per_day <= {ceilings.per_day})"
            )
        if request.timeout_seconds is not None and not 0 < request.timeout_seconds <= ceilings.timeout_seconds:
            raise InvalidArgument(f"timeout_seconds must be over 0 and at most {ceilings.timeout_seconds:g}")
        provider = await self.provider(request.provider)
        if provider is None:
            raise InvalidArgument(f"unknown provider {request.provider}")
        if provider.models and request.model not in provider.models:
            raise InvalidArgument(f"provider {provider.name} does not offer model {request.model}")
        if not request.model:
            raise InvalidArgument("model must not be empty")

    @translates_errors
    async def set_triage(
        self, caller: Caller, webhook_id: str, request: TriageSetting, ceilings: Ceilings
    ) -> TriageConfig:
        """Validate a triage stage exactly as it will run (granted queues, known provider and model, ceilings)
        and save it under the webhook's row lock; a refusal changes nothing."""
        await self._check_setting(request, ceilings)
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT id FROM endpoint_webhooks WHERE id = %s AND state = 'live' FOR UPDATE", (webhook_id,)
            )
            grant = await self._owned_grant(conn, caller, webhook_id)
            queues = check_triage_queues(request.queues, grant)
            await conn.execute(
                _UPSERT_TRIAGE,
                {
                    "webhook": webhook_id,
                    "provider": request.provider,
                    "model": request.model,
                    "queues": Jsonb([q.model_dump() for q in queues]),
                    "threshold": request.threshold,
                    "per_minute": request.per_minute,
                    "per_day": request.per_day,
                    "include_payload": request.include_payload,
                    "timeout": request.timeout_seconds,
                    "by": caller.endpoint_id,
                },
            )
            saved = await self._triage_on(conn, webhook_id)
        assert saved is not None
        return saved

    @translates_errors
    async def candidate_triage(
        self, caller: Caller, webhook_id: str, request: TriageSetting, ceilings: Ceilings
    ) -> tuple[TriageConfig, Grant]:
        """A triage stage validated exactly as set_triage would save it, and the webhook's grant; nothing saved."""
        async with self.pool.connection() as conn:
            grant = await self._owned_grant(conn, caller, webhook_id)
        await self._check_setting(request, ceilings)
        queues = check_triage_queues(request.queues, grant)
        stage = TriageConfig(
            provider=request.provider,
            model=request.model,
            queues=queues,
            threshold=request.threshold,
            per_minute=request.per_minute,
            per_day=request.per_day,
            include_payload=request.include_payload,
            timeout_seconds=request.timeout_seconds,
        )
        return stage, grant

    @translates_errors
    async def get_triage(self, caller: Caller, webhook_id: str) -> TriageConfig | None:
        """The triage stage of a webhook the caller's human owns; None when not configured."""
        async with self.pool.connection() as conn:
            await self._owned_grant(conn, caller, webhook_id)
            return await self._triage_on(conn, webhook_id)

    @translates_errors
    async def clear_triage(self, caller: Caller, webhook_id: str) -> bool:
        """Turn triage off for a webhook the caller's human owns; whether there was a stage to remove."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._owned_grant(conn, caller, webhook_id)
            cur = await conn.execute(
                "DELETE FROM webhook_llm_triage WHERE webhook_id = %s RETURNING webhook_id", (webhook_id,)
            )
            return await cur.fetchone() is not None

    @translates_errors
    async def triage_config(self, webhook_id: str) -> TriageConfig | None:
        """A webhook's triage stage (no ownership check: the worker's and the grant's read)."""
        async with self.pool.connection() as conn:
            return await self._triage_on(conn, webhook_id)

    async def _triage_on(self, conn: AsyncConnection[DictRow], webhook_id: str) -> TriageConfig | None:
        cur = await conn.execute(
            f"SELECT {_TRIAGE_COLUMNS} FROM webhook_llm_triage WHERE webhook_id = %s",  # noqa: S608 - constant
            (webhook_id,),
        )
        row = await cur.fetchone()
        return _triage_of(row) if row is not None else None

    # --- budgets ---

    @translates_errors
    async def take_budget(
        self, endpoint_id: str, webhook_id: str, *, per_minute: int, per_day: int, ceilings: Ceilings
    ) -> str | None:
        """Count one triage call against the webhook's own windows and its endpoint's total, all or nothing.

        None when taken; else the exhausted window ("webhook:minute", "endpoint:day", …) and nothing counted.
        The webhook's per_minute/per_day bound that webhook; the operator ceilings bound the endpoint's sum
        over all its webhooks, so many webhooks cannot multiply one endpoint's spend.
        """
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT llm_budget_take(%s, %s, %s, %s, %s, %s) AS exhausted",
                (endpoint_id, webhook_id, per_minute, per_day, ceilings.per_minute, ceilings.per_day),
            )
            row = await cur.fetchone()
        return row["exhausted"] if row is not None else "unknown"
