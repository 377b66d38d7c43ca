"""GET /metrics: the process registry (switchboard/metrics.py) plus this app's database gauges (metrics_database.py)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from api.deps import Services, services
from switchboard.metrics_database import DatabaseGauges, DatabaseSnapshot

router = APIRouter(tags=["health"])

# Most (queue, state) groups one scrape reports: a fleet with more queues than this sees the largest ones.
TODO_GROUPS_MAX = 500


def _gauges(request: Request) -> tuple[DatabaseGauges, CollectorRegistry]:
    """This app's database gauges, made on the first scrape (each app reads its own database)."""
    state = request.app.state
    found = getattr(state, "metrics_database", None)
    if found is None:
        svc = services(request)
        gauges = DatabaseGauges(lambda: _snapshot(svc), timeout=svc.settings.health_timeout_seconds)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(gauges)
        found = state.metrics_database = (gauges, registry)
    assert isinstance(found, tuple)
    return found


async def _snapshot(svc: Services) -> DatabaseSnapshot:
    inbox, todos = await asyncio.gather(svc.inbox.stats(), svc.todos.live_counts(TODO_GROUPS_MAX))
    return DatabaseSnapshot(
        inbox_depth=inbox.depth,
        inbox_due=inbox.due,
        inbox_parked=inbox.parked,
        inbox_oldest_age_seconds=inbox.oldest_age_seconds or 0.0,
        inbox_lag_seconds=inbox.lag_seconds or 0.0,
        todos=todos,
    )


@router.get("/metrics", summary="Prometheus metrics of this process and the shared database.", include_in_schema=False)
async def metrics(request: Request) -> Response:
    gauges, registry = _gauges(request)
    await gauges.refresh()
    # Two expositions back to back: their metric names never overlap, so the text is one valid scrape.
    body = generate_latest(REGISTRY) + generate_latest(registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
