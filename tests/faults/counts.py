"""How hard each fault scenario pushes: bench/faults.py runs FULL, the suite SMALL."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counts:
    """How hard each scenario pushes: bench/faults.py uses FULL, the suite SMALL."""

    worker_kills: int = 20
    outage: float = 20.0
    api_restarts: int = 3
    storm_ids: int = 10
    storm_posts: int = 50
    storm_concurrency: int = 50
    lead: float = 3.0  # seconds of load before a fault
    tail: float = 5.0  # seconds of load after a fault ends
    senders: int = 4
    interval: float = 0.25
    api_down: float = 30.0  # the reconcile row: the API down this long while GitHub sends
    slow_one_address: int = 1000  # slow connections from one client address
    slow_spread: int = 4000  # more slow connections, spread over `slow_addresses` other addresses
    slow_addresses: int = 40
    slow_nofile: int | None = 3000  # the API's descriptor limit during the slow-clients row (None: unchanged)
    hangups: int = 100  # producers hanging up mid-body
    hostile_rounds: int = 5  # each hostile body delivered this many times (fresh delivery ids)
    text_rounds: int = 2  # each tenant of the text-bodies row sends each 1 MiB body this many times
    inbox_wait: float = 10.0  # the text-bodies row: Temporal stopped this long while poison rows wait among others


FULL = Counts()
SMALL = Counts(
    worker_kills=3,
    outage=5.0,
    api_restarts=1,
    storm_ids=3,
    storm_posts=10,
    storm_concurrency=10,
    lead=2.0,
    tail=3.0,
    api_down=5.0,
    slow_one_address=300,
    slow_spread=0,
    slow_nofile=None,
    hangups=10,
    hostile_rounds=1,
    text_rounds=1,
    inbox_wait=3.0,
)
