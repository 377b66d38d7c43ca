"""Collector configuration of a webhook: kind rule, coalescing subject path, optional HMAC secret (sealed)."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from routing.collectors import CollectorConfig
from routing.sources import RESERVED_SOURCES, find_source
from store.crypto import SecretBox
from store.db import Pool
from store.errors import InvalidArgument, NotFound, translates_errors
from store.ids import new_webhook_secret
from store.models import Caller
from store.webhooks import collector_secret_context


class CollectorStore:
    """Writes endpoint_webhooks.config["collector"] and the collector's sealed HMAC secret."""

    def __init__(self, pool: Pool, box: SecretBox) -> None:
        self.pool = pool
        self.box = box

    @translates_errors
    async def configure(
        self, caller: Caller, webhook_id: str, config: CollectorConfig, *, rotate_secret: bool
    ) -> dict[str, Any]:
        """Replace the collector configuration of one of the caller's webhooks.

        An HMAC secret is minted when HMAC is first enabled (or on rotate_secret) and returned only then;
        disabling HMAC drops it.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT id, source_type, config, collector_secret_ciphertext IS NOT NULL AS has_secret"
                " FROM endpoint_webhooks WHERE id = %s AND endpoint_id = %s AND state = 'live'"
                " AND NOT source_type = ANY(%s) FOR UPDATE",
                (webhook_id, caller.endpoint_id, list(RESERVED_SOURCES)),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFound("unknown webhook")
            source = find_source(row["source_type"])
            if (source is None or not source.collector) and (config.hmac is not None or config.kind is not None):
                raise InvalidArgument(
                    "hmac and kind apply to generic collectors only; signed sources verify and derive kind"
                    " by their own scheme"
                )
            secret: str | None = None
            sealed: bytes | None = None
            keep_sealed = False
            if config.hmac is not None:
                if rotate_secret or not row["has_secret"]:
                    secret = new_webhook_secret()
                    sealed = self.box.seal(secret, collector_secret_context(webhook_id))
                else:
                    keep_sealed = True
            stored = dict(row["config"] or {})
            stored["collector"] = config.model_dump(exclude_none=True)
            await conn.execute(
                "UPDATE endpoint_webhooks SET config = %s, updated_at = now(),"
                " collector_secret_ciphertext = CASE WHEN %s THEN collector_secret_ciphertext ELSE %s::bytea END"
                " WHERE id = %s",
                (Jsonb(stored), keep_sealed, sealed, webhook_id),
            )
        return {
            "webhook_id": webhook_id,
            "source_type": row["source_type"],
            "collector": stored["collector"],
            "hmac_secret": secret,
        }
