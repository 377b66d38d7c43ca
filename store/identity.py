"""Humans, agents, endpoints (credentials and scope) and friend edges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.db import Pool
from store.doorbell import REVOKED_CHANNEL
from store.errors import InvalidArgument, NotFound, Unauthenticated, translates_errors
from store.events import decode_cursor, encode_cursor
from store.ids import credential_hash, new_credential, new_id
from store.models import Caller


@dataclass(frozen=True)
class Page:
    """One page of an operator listing (rows as dictionaries) and the cursor of the next, when there is one."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


_AUTH_SQL = """
SELECT e.id AS endpoint_id, e.agent_id, a.owner_human_id AS human_id, e.scope_queues, e.scope_verbs,
       e.webhook_max, e.webhook_source_types, e.webhook_queues
FROM endpoints e JOIN agents a ON a.id = e.agent_id
WHERE e.credential_hash = %s AND e.state = 'live'
"""

# The NOTIFY (delivered at commit) tells every API process to close the endpoint's open streams at once.
_REVOKE = """
WITH r AS (
    UPDATE endpoints SET state = 'revoked', revoked_at = coalesce(revoked_at, now()) WHERE id = %(id)s
    RETURNING id
)
SELECT id, pg_notify(%(channel)s, id) AS rang FROM r
"""


def credential_valid(credential: str) -> bool:
    """Whether a bearer credential has the shape of one this store mints (checked before any lookup)."""
    return credential.startswith("sbk_") and len(credential) <= 200


# The operator's listings, newest first, paged by the history's keyset cursor over (created_at, id) as todos are.
# The endpoint listing names its columns: never credential_hash (only the prefix vend_endpoint showed).
_AFTER = "(%(after_at)s::timestamptz IS NULL OR (x.created_at, x.id) < (%(after_at)s::timestamptz, %(after_id)s::text))"
_PAGE = "ORDER BY x.created_at DESC, x.id DESC LIMIT %(limit)s"

_LIST_HUMANS = f"""
SELECT x.id AS human_id, x.name, x.created_at,
       (SELECT count(*) FROM agents a WHERE a.owner_human_id = x.id)::int AS agents
FROM humans x
WHERE {_AFTER}
{_PAGE}
"""  # noqa: S608 - constant fragments only

_LIST_AGENTS = f"""
SELECT x.id AS agent_id, x.owner_human_id AS human_id, x.name, x.created_at,
       (SELECT count(*) FROM endpoints e WHERE e.agent_id = x.id AND e.state = 'live')::int AS live_endpoints
FROM agents x
WHERE (%(human)s::text IS NULL OR x.owner_human_id = %(human)s) AND {_AFTER}
{_PAGE}
"""  # noqa: S608 - constant fragments only

_LIST_ENDPOINTS = f"""
SELECT x.id AS endpoint_id, x.agent_id, a.owner_human_id AS human_id, x.credential_prefix, x.state,
       x.scope_queues AS queues, x.scope_verbs AS verbs, x.webhook_max, x.webhook_source_types, x.webhook_queues,
       (SELECT count(*) FROM endpoint_webhooks w WHERE w.endpoint_id = x.id AND w.state = 'live')::int AS webhooks,
       x.created_at, x.revoked_at
FROM endpoints x JOIN agents a ON a.id = x.agent_id
WHERE (%(agent)s::text IS NULL OR x.agent_id = %(agent)s)
  AND (%(human)s::text IS NULL OR a.owner_human_id = %(human)s)
  AND (%(state)s::text IS NULL OR x.state = %(state)s)
  AND {_AFTER}
{_PAGE}
"""  # noqa: S608 - constant fragments only


class IdentityStore:
    """Operator-side identity records and credential resolution.

    A row naming a human or agent that does not exist fails its foreign key, which `store/errors.py`
    (`CONSTRAINT_ERRORS`) answers as not_found.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @translates_errors
    async def create_human(self, name: str) -> str:
        """Create a human and return its id."""
        human_id = new_id("hu")
        async with self.pool.connection() as conn:
            await conn.execute("INSERT INTO humans (id, name) VALUES (%s, %s)", (human_id, name))
        return human_id

    @translates_errors
    async def create_agent(self, human_id: str, name: str) -> str:
        """Create an agent owned by a human."""
        agent_id = new_id("ag")
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO agents (id, owner_human_id, name) VALUES (%s, %s, %s)",
                (agent_id, human_id, name),
            )
        return agent_id

    @translates_errors
    async def vend_endpoint(
        self,
        *,
        agent_id: str,
        queues: list[str],
        verbs: list[str],
        webhook_max: int,
        webhook_source_types: list[str],
        webhook_queues: list[str],
    ) -> dict[str, Any]:
        """Mint an endpoint; the credential is returned here and never again."""
        if webhook_max < 0:
            raise InvalidArgument("webhook_max must be >= 0")
        endpoint_id = new_id("ep")
        credential = new_credential()
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO endpoints (id, agent_id, credential_hash, credential_prefix, scope_queues,"
                " scope_verbs, webhook_max, webhook_source_types, webhook_queues)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    endpoint_id,
                    agent_id,
                    credential_hash(credential),
                    credential[:12],
                    queues,
                    verbs,
                    webhook_max,
                    webhook_source_types,
                    webhook_queues,
                ),
            )
        return {
            "endpoint_id": endpoint_id,
            "credential": credential,
            "credential_prefix": credential[:12],
            "agent_id": agent_id,
            "queues": queues,
            "verbs": verbs,
            "webhook_max": webhook_max,
            "webhook_source_types": webhook_source_types,
            "webhook_queues": webhook_queues,
        }

    @translates_errors
    async def revoke_endpoint(self, endpoint_id: str) -> bool:
        """Revoke an endpoint at once; idempotent. Returns whether it exists."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(_REVOKE, {"id": endpoint_id, "channel": REVOKED_CHANNEL})
            row = await cur.fetchone()
        if row is None:
            raise NotFound("unknown endpoint")
        return True

    @translates_errors
    async def set_friend_edge(self, from_human_id: str, to_human_id: str, state: str) -> None:
        """Record the directional friend edge from one human to another."""
        if state not in ("pending", "approved", "denied", "revoked"):
            raise InvalidArgument("state must be one of pending, approved, denied, revoked")
        if from_human_id == to_human_id:
            raise InvalidArgument("a friend edge joins two different humans")
        async with self.pool.connection() as conn:
            await conn.execute(
                "INSERT INTO friend_edges (from_human_id, to_human_id, state) VALUES (%s, %s, %s)"
                " ON CONFLICT (from_human_id, to_human_id)"
                " DO UPDATE SET state = excluded.state, updated_at = now()",
                (from_human_id, to_human_id, state),
            )

    async def _page(self, query: str, id_column: str, params: dict[str, Any], limit: int, cursor: str | None) -> Page:
        after_at, after_id = decode_cursor(cursor) if cursor else (None, None)
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, {**params, "after_at": after_at, "after_id": after_id, "limit": limit + 1})
            rows = list(await cur.fetchall())
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if rows else None
        next_cursor = encode_cursor(last["created_at"], last[id_column]) if more and last else None
        return Page(rows=rows, next_cursor=next_cursor)

    @translates_errors
    async def list_humans(self, *, limit: int, cursor: str | None = None) -> Page:
        """Humans, newest first, with how many agents each owns."""
        return await self._page(_LIST_HUMANS, "human_id", {}, limit, cursor)

    @translates_errors
    async def list_agents(self, *, human_id: str | None, limit: int, cursor: str | None = None) -> Page:
        """Agents (of one human, if given), newest first, with how many live endpoints each has."""
        return await self._page(_LIST_AGENTS, "agent_id", {"human": human_id}, limit, cursor)

    @translates_errors
    async def list_endpoints(
        self,
        *,
        agent_id: str | None,
        human_id: str | None,
        state: str | None,
        limit: int,
        cursor: str | None = None,
    ) -> Page:
        """Endpoints (filtered by agent, human, state), newest first: scope and credential prefix, never its hash."""
        params = {"agent": agent_id, "human": human_id, "state": state}
        return await self._page(_LIST_ENDPOINTS, "endpoint_id", params, limit, cursor)

    @translates_errors
    async def authenticate(self, credential: str) -> Caller:
        """Resolve a bearer credential to a live endpoint, or raise Unauthenticated."""
        if not credential_valid(credential):
            raise Unauthenticated("invalid credential")
        async with self.pool.connection() as conn:
            cur = await conn.execute(_AUTH_SQL, (credential_hash(credential),))
            row = await cur.fetchone()
        if row is None:
            raise Unauthenticated("invalid or revoked credential")
        return Caller.model_validate(row)
