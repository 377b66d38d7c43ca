"""Token buckets and concurrency limits keyed by client IP or endpoint id; in-process, so per API process."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator


class TokenBuckets:
    """rate tokens per second, up to burst; take() says how long to wait when empty."""

    def __init__(self, rate: float, burst: int, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max_keys
        self._state: dict[str, tuple[float, float]] = {}

    def take(self, key: str, now: float | None = None) -> float:
        """Take one token; 0.0 when allowed, else seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        tokens, last = self._state.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            if len(self._state) >= self.max_keys and key not in self._state:
                self._state.clear()  # bounded memory under a flood of distinct keys
            self._state[key] = (tokens - 1.0, now)
            return 0.0
        self._state[key] = (tokens, now)
        return (1.0 - tokens) / self.rate


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
