"""Every fault scenario of the campaign, by the name `bench/faults.py --only` and the suite call it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tests.faults.bounds import hostile_bodies, hostile_calls, producer_hangups, slow_clients
from tests.faults.counts import Counts
from tests.faults.reconcile import api_down_then_reconcile
from tests.faults.scenarios import (
    api_restarts,
    duplicate_storm,
    postgres_outage,
    scale_out,
    temporal_freeze,
    temporal_outage,
    worker_kills,
)
from tests.faults.stack import FaultStack
from tests.faults.stalls import hostile_text_bodies, postgres_frozen
from tests.faults.tally import Outcome

SCENARIOS: dict[str, Callable[[FaultStack, Counts], Awaitable[Outcome]]] = {
    "worker": worker_kills,
    "temporal": temporal_outage,
    "freeze": temporal_freeze,
    "postgres": postgres_outage,
    "api": api_restarts,
    "storm": duplicate_storm,
    "scaleout": scale_out,
    "slow": slow_clients,
    "hangups": producer_hangups,
    "bodies": hostile_bodies,
    "calls": hostile_calls,
    "textbodies": hostile_text_bodies,
    "pgfreeze": postgres_frozen,
    "reconcile": api_down_then_reconcile,
}
