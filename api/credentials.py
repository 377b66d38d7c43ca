"""Bearer credentials resolved once per process, for as long as the doorbell listener proves it hears revocations.

Resolving a credential costs an agent call a database round trip; this cache spares it. An endpoint's scope is
immutable, so the only thing that can make a resolved credential wrong is a revocation, and a revocation already
NOTIFYs `switchboard_revoked` on commit (store/identity.py), which this process's doorbell listener relays to
`DoorbellHub.revoke` (api/doorbell.py). The cache is one more watcher of that hub: a revocation drops the
endpoint's entries, and the listener's liveness round trip re-checks every cached endpoint the way it re-checks
open streams.

The cache is only trusted while the listener is proven to hear: it is bypassed (every call resolves in the
database) while the listener is not listening, and an entry made under an earlier LISTEN connection
is never used after a reconnect (revocations during the gap were not heard). An entry is stored only if no
revocation landed in this process and the connection did not change while its lookup was in flight, so a
lookup that read the endpoint just before its revoke cannot outlive the NOTIFY. A revoke made through this
process drops the entries before it answers (api/verbs/admin.py), so the revoker's next call is refused.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from api.doorbell import DoorbellHub
from store.errors import Unauthenticated
from store.identity import IdentityStore, credential_valid
from store.ids import credential_hash
from store.models import Caller

MAX_ENTRIES = 10_000
"""Credentials remembered per process; the least recently used is forgotten first."""


class Hearing(Protocol):
    """What the cache needs of the doorbell listener: whether it hears now, and under which connection."""

    def hearing(self) -> int | None:
        """The id of the LISTEN connection proven to hear now; None while it does not."""
        ...


@dataclass(frozen=True)
class _Entry:
    caller: Caller
    connection: int  # the listener connection under which the lookup ran


class CredentialCache:
    """credential → Caller for live endpoints, dropped on revocation; a DoorbellHub watcher."""

    def __init__(self, identities: IdentityStore, hub: DoorbellHub, max_entries: int = MAX_ENTRIES) -> None:
        self.identities = identities
        self.hub = hub
        self.listener: Hearing | None = None
        """Set by the app lifespan once the doorbell listener runs; without one the cache is always bypassed."""
        self.max_entries = max(1, max_entries)
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._by_endpoint: dict[str, set[bytes]] = {}
        self.hits = 0
        self.misses = 0
        self.bypassed = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def authenticate(self, credential: str) -> Caller:
        """The live endpoint of a bearer credential, or Unauthenticated (as IdentityStore.authenticate)."""
        if not credential_valid(credential):
            raise Unauthenticated("invalid credential")
        connection = self.listener.hearing() if self.listener is not None else None
        if connection is None:
            self.bypassed += 1
            return await self.identities.authenticate(credential)
        key = credential_hash(credential)
        entry = self._entries.get(key)
        if entry is not None and entry.connection == connection:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.caller
        self.misses += 1
        revocations = self.hub.revocations
        caller = await self.identities.authenticate(credential)
        listener = self.listener
        if self.hub.revocations == revocations and listener is not None and listener.hearing() == connection:
            self._store(key, _Entry(caller, connection))
        return caller

    def _store(self, key: bytes, entry: _Entry) -> None:
        self._drop(key)
        self._entries[key] = entry
        self._by_endpoint.setdefault(entry.caller.endpoint_id, set()).add(key)
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        keys = self._by_endpoint.get(entry.caller.endpoint_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_endpoint[entry.caller.endpoint_id]

    def endpoints(self) -> set[str]:
        """Endpoints with a cached credential (the listener's liveness check re-checks them)."""
        return set(self._by_endpoint)

    async def revoke(self, endpoint_id: str) -> None:
        """Forget every credential of a revoked endpoint."""
        for key in list(self._by_endpoint.get(endpoint_id, ())):
            self._drop(key)

    def clear(self) -> None:
        """Forget everything."""
        self._entries.clear()
        self._by_endpoint.clear()
