"""Humans, agents, endpoints (credentials and scope) and friend edges."""

from __future__ import annotations

from typing import Any

from store.db import Pool
from store.doorbell import REVOKED_CHANNEL
from store.errors import InvalidArgument, NotFound, Unauthenticated, translates_errors
from store.ids import credential_hash, new_credential, new_id
from store.models import Caller

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
