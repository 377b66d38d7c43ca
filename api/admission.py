"""Admission at ingest: when to send a verified delivery straight to the inbox instead of Temporal."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from store.inbox import InboxReason


class Admission:
    """Per API process: a bound on starts+waits in flight, and a short pause on Temporal after it failed a start.

    Past the bound the workers are not keeping up; queueing more producers in front of them would only make
    every answer late, so new deliveries go to the inbox (one statement) and are answered `pending` at once.
    After a start Temporal did not take in time, the next deliveries skip it for a moment rather than each
    spending the whole start deadline; the first one after the pause probes again.
    """

    def __init__(self, max_inflight: int, backoff_seconds: float) -> None:
        self.max_inflight = max_inflight
        self.backoff_seconds = backoff_seconds
        self.inflight = 0
        self._skip_until = 0.0

    def diversion(self) -> InboxReason | None:
        """Why the next delivery should go to the inbox at once, or None to try Temporal."""
        if time.monotonic() < self._skip_until:
            return "temporal_unavailable"
        if self.max_inflight > 0 and self.inflight >= self.max_inflight:
            return "admission"
        return None

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Count one start+wait in flight for the block."""
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    def start_failed(self) -> None:
        """Temporal did not take a start: skip it for a moment."""
        self._skip_until = time.monotonic() + self.backoff_seconds

    def start_ok(self) -> None:
        """Temporal took a start: stop skipping it."""
        self._skip_until = 0.0
