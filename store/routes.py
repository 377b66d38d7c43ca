"""Webhook routes: the explicit fan-out targets of a webhook, under ownership and friendship."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from pydantic import BaseModel

from store.db import Pool
from store.errors import Forbidden, NotFound, translates_errors
from store.models import Caller

# One message for every refusal of each kind, so neither verb tells an unknown id from a foreign one.
WEBHOOK_NOT_FOUND = "unknown webhook"
TARGET_FORBIDDEN = "target endpoint cannot receive this webhook's deliveries"

# The webhook, when the caller's human owns it (its owning endpoint's agent belongs to that human). The row
# lock keeps a concurrent delete_webhook from slipping between this check and the route write.
_OWNED_WEBHOOK = """
SELECT w.id, w.endpoint_id
FROM endpoint_webhooks w
JOIN endpoints e ON e.id = w.endpoint_id
JOIN agents a ON a.id = e.agent_id
WHERE w.id = %(webhook)s AND w.state = 'live' AND a.owner_human_id = %(human)s
FOR SHARE OF w
"""

# A live target endpoint of the same human, or of a human the caller's human hands work to: an approved
# edge in the delivering direction only (from the caller's human to the target's human).
_AUTHORIZED_TARGET = """
SELECT e.id
FROM endpoints e
JOIN agents a ON a.id = e.agent_id
WHERE e.id = %(target)s AND e.state = 'live' AND (
    a.owner_human_id = %(human)s OR EXISTS (
        SELECT 1 FROM friend_edges f
        WHERE f.from_human_id = %(human)s AND f.to_human_id = a.owner_human_id AND f.state = 'approved'))
"""

# The explicit routes in target order, each flagged with whether a delivery would reach it now; the
# liveness test is the one the per-delivery grant applies (store/webhooks.py _GRANT_SQL).
_LIST_ROUTES = """
SELECT r.target_endpoint_id AS endpoint_id, r.granted_at,
       coalesce(e.state = 'live' AND (a.owner_human_id = %(human)s OR EXISTS (
           SELECT 1 FROM friend_edges f
           WHERE f.from_human_id = %(human)s AND f.to_human_id = a.owner_human_id AND f.state = 'approved')),
           false) AS live
FROM webhook_routes r
LEFT JOIN endpoints e ON e.id = r.target_endpoint_id
LEFT JOIN agents a ON a.id = e.agent_id
WHERE r.webhook_id = %(webhook)s AND r.target_endpoint_id <> %(owner)s
ORDER BY r.granted_at, r.target_endpoint_id
"""


class RouteTarget(BaseModel):
    """One member of a webhook's fan-out set as its owner sees it."""

    endpoint_id: str
    implicit: bool
    live: bool
    granted_at: datetime | None = None


class RouteChange(BaseModel):
    """The outcome of an idempotent add or remove."""

    webhook_id: str
    target_endpoint_id: str
    implicit: bool
    changed: bool


class RouteStore:
    """add/list/remove of webhook routes for the webhook's owning human."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def add(self, caller: Caller, webhook_id: str, target_endpoint_id: str) -> RouteChange:
        """Record a route once; the owner is already a target, any other target must be authorized."""
        async with self.pool.connection() as conn, conn.transaction():
            owner = await self._owned(conn, caller, webhook_id)
            if target_endpoint_id == owner:
                return RouteChange(
                    webhook_id=webhook_id, target_endpoint_id=target_endpoint_id, implicit=True, changed=False
                )
            cur = await conn.execute(_AUTHORIZED_TARGET, {"target": target_endpoint_id, "human": caller.human_id})
            if await cur.fetchone() is None:
                raise Forbidden(TARGET_FORBIDDEN)
            cur = await conn.execute(
                "INSERT INTO webhook_routes (webhook_id, target_endpoint_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING RETURNING webhook_id",
                (webhook_id, target_endpoint_id),
            )
            created = await cur.fetchone() is not None
        return RouteChange(
            webhook_id=webhook_id, target_endpoint_id=target_endpoint_id, implicit=False, changed=created
        )

    @translates_errors
    async def remove(self, caller: Caller, webhook_id: str, target_endpoint_id: str) -> RouteChange:
        """Drop a route if present; ownership only, so a route whose friendship lapsed stays removable."""
        async with self.pool.connection() as conn, conn.transaction():
            owner = await self._owned(conn, caller, webhook_id)
            if target_endpoint_id == owner:
                return RouteChange(
                    webhook_id=webhook_id, target_endpoint_id=target_endpoint_id, implicit=True, changed=False
                )
            cur = await conn.execute(
                "DELETE FROM webhook_routes WHERE webhook_id = %s AND target_endpoint_id = %s RETURNING webhook_id",
                (webhook_id, target_endpoint_id),
            )
            removed = await cur.fetchone() is not None
        return RouteChange(
            webhook_id=webhook_id, target_endpoint_id=target_endpoint_id, implicit=False, changed=removed
        )

    @translates_errors
    async def list(self, caller: Caller, webhook_id: str) -> list[RouteTarget]:
        """The owner (implicit) first, then every explicit route in target order, live or not."""
        async with self.pool.connection() as conn, conn.transaction():
            owner = await self._owned(conn, caller, webhook_id)
            cur = await conn.execute("SELECT state = 'live' AS live FROM endpoints WHERE id = %s", (owner,))
            owner_row = await cur.fetchone()
            cur = await conn.execute(_LIST_ROUTES, {"webhook": webhook_id, "owner": owner, "human": caller.human_id})
            rows = await cur.fetchall()
        out = [RouteTarget(endpoint_id=owner, implicit=True, live=bool(owner_row and owner_row["live"]))]
        out.extend(RouteTarget(implicit=False, **r) for r in rows)
        return out

    async def _owned(self, conn: AsyncConnection[Any], caller: Caller, webhook_id: str) -> str:
        """The owning endpoint of a live webhook the caller's human owns; not_found otherwise."""
        cur = await conn.execute(_OWNED_WEBHOOK, {"webhook": webhook_id, "human": caller.human_id})
        row = await cur.fetchone()
        if row is None:
            raise NotFound(WEBHOOK_NOT_FOUND)
        return str(row["endpoint_id"])
