"""Webhooks: creation within the endpoint's ceiling, ingest lookup and the per-delivery grant."""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidTag
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from routing.actions import QUARANTINE
from routing.models import Grant, Target, TriageConfig
from routing.sources import RESERVED_SOURCES, SOURCE_TYPES, find_source
from routing.trust import GateError, parse_gate
from store.crypto import SecretBox
from store.db import Pool
from store.errors import (
    CeilingExceeded,
    Conflict,
    Forbidden,
    ForbiddenSourceType,
    InvalidArgument,
    NotFound,
    translates_errors,
)
from store.ids import new_id, new_ingest_token, new_webhook_secret
from store.models import Caller, IngestWebhook, Webhook

_WEBHOOK_COLUMNS = (
    "id, endpoint_id, source_type, target_queue, trust_mode, ingest_token, state, created_at, updated_at,"
    " routing_rules, routing_default_action, routing_params, config, trusted_actors"
)

# The webhook and its live targets in one round trip. Target order: the owner first, then routes by
# granted_at, then endpoint id. A route counts only while its endpoint is live and, across humans, while an
# approved friend edge runs from the owner's human to the target's human.
_GRANT_SQL = """
WITH w AS (
    SELECT w.id, w.endpoint_id, w.source_type, w.target_queue, w.routing_rules, w.routing_default_action,
           w.routing_params, w.routing_on_fault, w.config, w.trusted_actors, e.webhook_queues,
           a.owner_human_id AS human_id
    FROM endpoint_webhooks w
    JOIN endpoints e ON e.id = w.endpoint_id
    JOIN agents a ON a.id = e.agent_id
    WHERE w.id = %(webhook)s AND w.state = 'live'
), targets AS (
    SELECT e.id AS endpoint_id, e.scope_queues, 0 AS rank, NULL::timestamptz AS granted_at
    FROM w JOIN endpoints e ON e.id = w.endpoint_id AND e.state = 'live'
    UNION ALL
    SELECT e.id, e.scope_queues, 1, r.granted_at
    FROM w
    JOIN webhook_routes r ON r.webhook_id = w.id AND r.target_endpoint_id <> w.endpoint_id
    JOIN endpoints e ON e.id = r.target_endpoint_id AND e.state = 'live'
    JOIN agents a ON a.id = e.agent_id
    WHERE a.owner_human_id = w.human_id OR EXISTS (
        SELECT 1 FROM friend_edges f
        WHERE f.from_human_id = w.human_id AND f.to_human_id = a.owner_human_id AND f.state = 'approved')
)
SELECT w.*, coalesce((
    SELECT json_agg(json_build_object('endpoint_id', t.endpoint_id, 'scope_queues', t.scope_queues)
                    ORDER BY t.rank, t.granted_at NULLS FIRST, t.endpoint_id)
    FROM targets t), '[]'::json) AS targets,
    (SELECT row_to_json(t) FROM webhook_llm_triage t WHERE t.webhook_id = w.id) AS llm_triage
FROM w
"""


# A live webhook of the caller's human, locked: the owner check of the verbs that change a webhook's trust gate.
_OWNED_FOR_UPDATE = """
SELECT w.id, w.source_type FROM endpoint_webhooks w
JOIN endpoints e ON e.id = w.endpoint_id
JOIN agents a ON a.id = e.agent_id
WHERE w.id = %s AND a.owner_human_id = %s AND w.state = 'live' AND NOT w.source_type = ANY(%s)
FOR UPDATE OF w
"""


class WebhookStore:
    """Webhook rows, their secrets (sealed at rest) and the grant a delivery routes under."""

    def __init__(self, pool: Pool, box: SecretBox) -> None:
        self.pool = pool
        self.box = box

    @translates_errors
    async def create(
        self, caller: Caller, source_type: str, target_queue: str, trusted_actors: Any = None
    ) -> dict[str, Any]:
        """Create a webhook within the caller's ceiling (with its trust gate, when given); the secret is in this
        result only."""
        source = find_source(source_type)
        if source is not None and source.reserved:
            # Internal sources (schedule fires) are switchboard's own; no agent may mint a URL for one.
            raise ForbiddenSourceType(f"source type {source_type} is reserved for switchboard")
        if source is None:
            raise InvalidArgument(f"unknown source_type; expected one of {', '.join(SOURCE_TYPES)}")
        if source_type not in caller.webhook_source_types:
            raise ForbiddenSourceType("source type not allowed by this endpoint's ceiling")
        if target_queue not in caller.webhook_queues:
            raise Forbidden("target queue not allowed by this endpoint's ceiling")
        if target_queue == QUARANTINE:
            raise InvalidArgument('the queue name "quarantine" is reserved for quarantined deliveries')
        gate = _gate(trusted_actors, source_type)
        trust_mode = source.trust_mode
        webhook_id = new_id("wh")
        secret = new_webhook_secret() if trust_mode == "signed" else None
        sealed = self.box.seal(secret, webhook_id) if secret else None
        token = new_ingest_token()
        async with self.pool.connection() as conn, conn.transaction():
            # The endpoint row lock serializes concurrent creates so the count check is atomic.
            await conn.execute("SELECT id FROM endpoints WHERE id = %s FOR UPDATE", (caller.endpoint_id,))
            cur = await conn.execute(
                "SELECT count(*) AS n FROM endpoint_webhooks WHERE endpoint_id = %s AND state = 'live'"
                " AND NOT source_type = ANY(%s)",
                (caller.endpoint_id, list(RESERVED_SOURCES)),
            )
            row = await cur.fetchone()
            assert row is not None
            if row["n"] >= caller.webhook_max:
                raise CeilingExceeded("webhook ceiling reached for this endpoint")
            await conn.execute(
                "INSERT INTO endpoint_webhooks (id, endpoint_id, source_type, target_queue, trust_mode,"
                " ingest_token, secret_ciphertext, trusted_actors) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    webhook_id,
                    caller.endpoint_id,
                    source_type,
                    target_queue,
                    trust_mode,
                    token,
                    sealed,
                    Jsonb(gate) if gate is not None else None,
                ),
            )
        return {
            "webhook_id": webhook_id,
            "source_type": source_type,
            "target_queue": target_queue,
            "trust_mode": trust_mode,
            "ingest_token": token,
            "secret": secret,
            "trusted_actors": gate,
        }

    @translates_errors
    async def set_trusted_actors(self, caller: Caller, webhook_id: str, trusted_actors: Any) -> dict[str, Any] | None:
        """Set (or, with None, remove) a webhook's trust gate; only its owner's human may, others get not_found."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_OWNED_FOR_UPDATE, (webhook_id, caller.human_id, list(RESERVED_SOURCES)))
            row = await cur.fetchone()
            if row is None:
                raise NotFound("unknown webhook")
            gate = _gate(trusted_actors, row["source_type"])
            await conn.execute(
                "UPDATE endpoint_webhooks SET trusted_actors = %s, updated_at = now() WHERE id = %s",
                (Jsonb(gate) if gate is not None else None, webhook_id),
            )
        return gate

    @translates_errors
    async def list_for_endpoint(self, caller: Caller) -> list[Webhook]:
        """Live webhooks owned by the calling endpoint."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_WEBHOOK_COLUMNS} FROM endpoint_webhooks"  # noqa: S608 - constant column list
                " WHERE endpoint_id = %s AND state = 'live' AND NOT source_type = ANY(%s) ORDER BY created_at, id",
                (caller.endpoint_id, list(RESERVED_SOURCES)),
            )
            rows = await cur.fetchall()
        return [Webhook.model_validate(r) for r in rows]

    @translates_errors
    async def get_for_ingest(self, token: str) -> IngestWebhook | None:
        """Resolve an ingest token to the webhook and its opened secret; None when unknown."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT id, endpoint_id, source_type, trust_mode, secret_ciphertext, collector_secret_ciphertext,"
                " config, rate_per_second FROM endpoint_webhooks WHERE ingest_token = %s AND state = 'live'",
                (token,),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        sealed = row.pop("secret_ciphertext")
        sealed_hmac = row.pop("collector_secret_ciphertext")
        secret, secret_unreadable = self._open(sealed, row["id"])
        collector_secret, collector_unreadable = self._open(sealed_hmac, collector_secret_context(row["id"]))
        return IngestWebhook(
            secret=secret,
            collector_secret=collector_secret,
            secret_unreadable=secret_unreadable,
            collector_secret_unreadable=collector_unreadable,
            **row,
        )

    def _open(self, sealed: Any, context: str) -> tuple[str | None, bool]:
        """A sealed secret opened, and whether it was present but would not open."""
        if sealed is None:
            return None, False
        try:
            return self.box.open(bytes(sealed), context), False
        except (InvalidTag, ValueError):
            # Sealed under another server key, or damaged: the receiver refuses rather than verify without it.
            return None, True

    @translates_errors
    async def load_grant(self, webhook_id: str) -> Grant:
        """The webhook's configuration and live targets, recomputed for one delivery."""
        async with self.pool.connection() as conn:
            grant = await self.grant_on(conn, webhook_id)
        if grant is None:
            raise NotFound("unknown webhook")
        return grant

    @translates_errors
    async def grant_on(self, conn: AsyncConnection[DictRow], webhook_id: str) -> Grant | None:
        """The grant computed on the caller's connection (inside its transaction); None when not live."""
        cur = await conn.execute(_GRANT_SQL, {"webhook": webhook_id})
        row = await cur.fetchone()
        if row is None:
            return None
        return Grant(
            webhook_id=row["id"],
            owner_endpoint_id=row["endpoint_id"],
            human_id=row["human_id"],
            source=row["source_type"],
            target_queue=row["target_queue"],
            allowed_queues=list(row["webhook_queues"]),
            targets=[Target.model_validate(t) for t in row["targets"]],
            rules=list(row["routing_rules"] or []),
            default_action=row["routing_default_action"],
            params=row["routing_params"],
            on_fault=row["routing_on_fault"],
            subject_path=((row["config"] or {}).get("collector") or {}).get("subject_path"),
            llm_triage=TriageConfig.model_validate(row["llm_triage"]) if row["llm_triage"] else None,
            trusted_actors=row["trusted_actors"],
        )

    @translates_errors
    async def set_rate(self, webhook_id: str, rate_per_second: float | None) -> None:
        """Set a webhook's own pace (deliveries/s; 0 = unpaced; None = back to the operator default)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE endpoint_webhooks SET rate_per_second = %s, updated_at = now()"
                " WHERE id = %s AND state = 'live' RETURNING id",
                (rate_per_second, webhook_id),
            )
            if await cur.fetchone() is None:
                raise NotFound("unknown webhook")

    @translates_errors
    async def rotate(self, caller: Caller, webhook_id: str, *, replace_token: bool) -> dict[str, Any]:
        """Mint a new secret (and, when asked, a new ingest token); the old ones stop working at commit."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT id, source_type, target_queue, trust_mode, ingest_token FROM endpoint_webhooks"
                " WHERE id = %s AND endpoint_id = %s AND state = 'live' AND NOT source_type = ANY(%s) FOR UPDATE",
                (webhook_id, caller.endpoint_id, list(RESERVED_SOURCES)),
            )
            row = await cur.fetchone()
            if row is None:
                raise NotFound("unknown webhook")
            signed = row["trust_mode"] == "signed"
            secret = new_webhook_secret() if signed else None
            sealed = self.box.seal(secret, webhook_id) if secret else None
            # For token trust the URL is the credential, so rotating always replaces it.
            token = new_ingest_token() if replace_token or not signed else row["ingest_token"]
            await conn.execute(
                "UPDATE endpoint_webhooks SET secret_ciphertext = %s, ingest_token = %s, updated_at = now()"
                " WHERE id = %s",
                (sealed, token, webhook_id),
            )
        return {
            "webhook_id": webhook_id,
            "source_type": row["source_type"],
            "target_queue": row["target_queue"],
            "trust_mode": row["trust_mode"],
            "ingest_token": token,
            "secret": secret,
        }

    @translates_errors
    async def delete(self, caller: Caller, webhook_id: str) -> None:
        """Tear a webhook down: its token stops resolving, its secret and routes go, its ceiling slot frees."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE endpoint_webhooks SET state = 'deleted', secret_ciphertext = NULL,"
                " collector_secret_ciphertext = NULL, deleted_at = now(), updated_at = now()"
                " WHERE id = %s AND endpoint_id = %s AND state = 'live' AND NOT source_type = ANY(%s) RETURNING id",
                (webhook_id, caller.endpoint_id, list(RESERVED_SOURCES)),
            )
            if await cur.fetchone() is None:
                raise NotFound("unknown webhook")
            # A schedule firing through this webhook would fire into nothing: make the owner choose.
            cur = await conn.execute(
                "SELECT count(*) AS n FROM schedules WHERE webhook_id = %s AND state = 'live'", (webhook_id,)
            )
            row = await cur.fetchone()
            if row is not None and row["n"]:
                raise Conflict(f"{row['n']} schedule(s) fire through this webhook; delete them first")
            await conn.execute("DELETE FROM webhook_routes WHERE webhook_id = %s", (webhook_id,))
            # Its reconciler's token goes with its secret; the reconciler's next run removes its schedule.
            await conn.execute("DELETE FROM webhook_reconcilers WHERE webhook_id = %s", (webhook_id,))


def _gate(trusted_actors: Any, source_type: str) -> dict[str, Any] | None:
    """A trust gate normalized for storage (routing.trust's own parser), or None for none; invalid_argument else."""
    if trusted_actors is None:
        return None
    try:
        return parse_gate(trusted_actors, source_type)[0]
    except GateError as exc:
        raise InvalidArgument(f"trusted_actors: {exc}") from None


def collector_secret_context(webhook_id: str) -> str:
    """Associated data sealing a generic collector's HMAC secret: never interchangeable with the signing secret."""
    return f"{webhook_id}:collector-hmac"
