"""The credential cache: revocations heard by NOTIFY refuse the very next call; no listener, no cache."""

from __future__ import annotations

from api.credentials import CredentialCache
from api.deps import Services
from api.doorbell import DoorbellListener
from store.db import open_pool
from store.identity import IdentityStore
from store.models import Caller
from tests.conftest import Stack
from tests.helpers import eventually


def services_of(stack: Stack) -> Services:
    svc = stack.app.state.services
    assert isinstance(svc, Services)
    return svc


def listener_of(stack: Stack) -> DoorbellListener:
    listener = stack.app.state.doorbell
    assert isinstance(listener, DoorbellListener)
    return listener


async def cached(stack: Stack, credential: str) -> CredentialCache:
    """Wait until the listener hears, then make two calls: the second is answered from the cache."""
    cache = services_of(stack).credentials
    await eventually(lambda: listener_of(stack).hearing() is not None)
    headers = {"Authorization": f"Bearer {credential}"}
    assert (await stack.http.post("/v1/whoami", json={}, headers=headers)).status_code == 200
    hits = cache.hits
    assert (await stack.http.post("/v1/whoami", json={}, headers=headers)).status_code == 200
    assert cache.hits == hits + 1, "the second call was not answered from the cache"
    return cache


async def test_a_revoke_through_this_process_refuses_the_very_next_call(stack: Stack) -> None:
    agent = await stack.agent()
    await cached(stack, agent.credential)
    await stack.admin("revoke_endpoint", {"endpoint_id": agent.endpoint_id})
    resp = await agent.call("claim_next", {})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"


async def test_a_revoke_in_another_process_is_heard_by_notify_and_refuses_the_next_call(stack: Stack) -> None:
    agent = await stack.agent()
    other = await stack.agent()
    cache = await cached(stack, agent.credential)
    await cached(stack, other.credential)
    listener = listener_of(stack)
    # Liveness round trips every 60 s from now: within this test only the NOTIFY can tell this process.
    listener.check_seconds = 60.0
    revocations = services_of(stack).doorbell.revocations
    pool = await open_pool(stack.database_url, max_size=1)  # "another API process": its own pool, no hub
    try:
        await IdentityStore(pool).revoke_endpoint(agent.endpoint_id)
    finally:
        await pool.close()
    await eventually(lambda: services_of(stack).doorbell.revocations > revocations, timeout=10)
    assert agent.endpoint_id not in cache.endpoints()
    resp = await agent.call("whoami", {})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
    # Only the revoked endpoint was forgotten: the other still answers from the cache.
    hits = cache.hits
    assert (await other.call("whoami", {})).status_code == 200
    assert cache.hits == hits + 1


async def test_a_revoke_missed_by_notify_is_found_by_the_liveness_check(stack: Stack) -> None:
    agent = await stack.agent()
    cache = await cached(stack, agent.credential)
    # Behind the API's back, no NOTIFY: the listener's round trip re-checks cached endpoints like open streams.
    stack.sql("UPDATE endpoints SET state = 'revoked', revoked_at = now() WHERE id = %s", agent.endpoint_id)
    await eventually(lambda: agent.endpoint_id not in cache.endpoints(), timeout=10)
    assert (await agent.call("whoami", {})).status_code == 401


async def test_while_the_listener_is_down_the_cache_is_bypassed(stack: Stack) -> None:
    agent = await stack.agent()
    cache = await cached(stack, agent.credential)
    await listener_of(stack).stop()
    assert listener_of(stack).hearing() is None
    # A revoke no NOTIFY can carry now: refused on the very next call all the same, from the database.
    stack.sql("UPDATE endpoints SET state = 'revoked', revoked_at = now() WHERE id = %s", agent.endpoint_id)
    bypassed = cache.bypassed
    resp = await agent.call("whoami", {})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthenticated"
    assert cache.bypassed == bypassed + 1


async def test_an_entry_made_under_an_earlier_listen_connection_is_not_used(stack: Stack) -> None:
    agent = await stack.agent()
    cache = await cached(stack, agent.credential)
    listener = listener_of(stack)
    connection = listener.hearing()
    await listener.stop()
    await listener.start()
    await eventually(lambda: listener.hearing() not in (None, connection))
    misses = cache.misses
    assert (await agent.call("whoami", {})).status_code == 200
    assert cache.misses == misses + 1, "an entry from before the reconnect answered"


async def test_a_lookup_that_races_a_revocation_is_not_kept(stack: Stack) -> None:
    agent = await stack.agent()
    svc = services_of(stack)
    await eventually(lambda: listener_of(stack).hearing() is not None)

    class RevokedMeanwhile(IdentityStore):
        async def authenticate(self, credential: str) -> Caller:
            caller = await super().authenticate(credential)  # read while still live…
            await svc.doorbell.revoke(caller.endpoint_id)  # …and revoked before the lookup returns
            return caller

    cache = CredentialCache(RevokedMeanwhile(svc.pool), svc.doorbell)
    cache.listener = listener_of(stack)
    svc.doorbell.caches.append(cache)
    try:
        await cache.authenticate(agent.credential)
        assert len(cache) == 0, "a credential read before its revocation was cached"
    finally:
        svc.doorbell.caches.remove(cache)
