"""Token buckets and concurrency limits keyed by client address or endpoint id; in-process, so limits apply per API process.

The bucket map is a bounded LRU: when it is full, the least recently touched bucket is forgotten (never all of
them at once). A bucket untouched for `burst / rate` seconds has refilled anyway, so forgetting it loses
nothing; only a flood of more than `max_keys` distinct keys inside that window can reset a live bucket, and then
the one reset is the stalest.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator


class TokenBuckets:
    """rate tokens per second, up to burst; a rate of 0 (or less) disables the limit."""

    def __init__(self, rate: float, burst: int, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max(1, max_keys)
        self._state: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._state)

    def _level(self, key: str, now: float) -> float:
        state = self._state.get(key)
        if state is None:
            return self.burst
        tokens, last = state
        return min(self.burst, tokens + max(0.0, now - last) * self.rate)

    def _store(self, key: str, tokens: float, now: float) -> None:
        if key in self._state:
            self._state.move_to_end(key)
        elif len(self._state) >= self.max_keys:
            self._state.popitem(last=False)  # the least recently touched bucket, not all of them
        self._state[key] = (tokens, now)

    def take(self, key: str, now: float | None = None) -> float:
        """Take one token; 0.0 when allowed, else seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens = self._level(key, now)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return 0.0
        self._store(key, tokens, now)
        return (1.0 - tokens) / self.rate

    def wait(self, key: str, now: float | None = None) -> float:
        """Seconds until key has a token, without taking one (0.0 when it has one); an unknown key is not stored."""
        if self.rate <= 0:
            return 0.0
        tokens = self._level(key, time.monotonic() if now is None else now)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def spend(self, key: str, now: float | None = None) -> None:
        """Charge key one token (a failure); an empty bucket stays empty, never goes into debt."""
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        self._store(key, max(0.0, self._level(key, now) - 1.0), now)


def retry_after(wait: float) -> str:
    """A Retry-After header value in whole seconds (at least 1)."""
    return str(max(1, math.ceil(wait)))


class KeyedLimits:
    """At most ``limit`` concurrent holders per key; later ones wait their turn. Idle keys are forgotten."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold one of the key's places for the block, waiting for one when all are taken."""
        semaphore, users = self._held.get(key) or (asyncio.Semaphore(self.limit), 0)
        self._held[key] = (semaphore, users + 1)
        try:
            async with semaphore:
                yield
        finally:
            semaphore, users = self._held[key]
            if users == 1:
                del self._held[key]
            else:
                self._held[key] = (semaphore, users - 1)
