"""The reconcile ledger: what a reconciler's runs read and write. The job (configuration with the token opened),
the deliveries of GitHub's log Switchboard never stored, the redeliveries asked for and whether they arrived, the
scan's checkpoint and the reconciler's state. docs/reconcile.md has the whole picture."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography.exceptions import InvalidTag
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from routing.delivery import workflow_id_for
from routing.sources import producer_delivery_id
from store.crypto import SecretBox
from store.db import Pool
from store.errors import NotFound, translates_errors
from store.reconcilers import DETAIL_MAX, RECONCILE_SOURCE, ScopeKind, Status, schedule_summary, token_context

# A delivery whose redelivery failed is asked for again after interval × 2^(requests - 1), at most this long, and
# at most this many times (within the lookback either way).
BACKOFF_MAX = timedelta(hours=6)
REQUESTS_MAX = 12
# A requested redelivery GitHub shows no attempt for after this long (or three intervals) is asked for again.
STALE_MIN = timedelta(minutes=10)


def external_id_of(webhook_id: str, guid: str) -> str | None:
    """The idempotency key a github delivery with this `X-GitHub-Delivery` guid gets at ingest; None when the
    receiver would not use the guid (routing.sources: empty or too long)."""
    found = producer_delivery_id(RECONCILE_SOURCE, {"x-github-delivery": guid}, None)
    return f"{webhook_id}:{found}" if found is not None else None


@dataclass(frozen=True)
class ReconcileJob:
    """What a run needs: the configuration with the token opened (None when it no longer opens), and the scan."""

    webhook_id: str
    scope_kind: ScopeKind
    scope_name: str | None
    hook_id: int | None
    api_url: str
    token: str | None = field(repr=False)
    interval_seconds: int
    lookback_hours: int
    temporal_schedule_id: str
    checkpoint_id: int | None
    scan_top_id: int | None
    scan_cursor: str | None
    backoff_until: datetime | None


@dataclass(frozen=True)
class ScheduleEntry:
    """One reconciler's Temporal Schedule, for the worker's start-up sync."""

    webhook_id: str
    temporal_schedule_id: str
    interval_seconds: int
    summary: str


@dataclass(frozen=True)
class Seen:
    """One delivery attempt as the scan hands it to the store."""

    guid: str
    attempt_id: int
    delivered_at: datetime
    delivered: bool


@dataclass
class Examined:
    """What one page did to the ledger: newly missing deliveries, requested ones that arrived or must be asked again."""

    missing: int = 0
    arrived: int = 0
    again: int = 0
    given_up: int = 0


@dataclass(frozen=True)
class Due:
    """A missing delivery to ask GitHub for: its guid and the attempt a redelivery names."""

    guid: str
    attempt_id: int
    requests: int


class ReconcileLedger:
    """A reconciler's runs: its job, the ledger of missing deliveries, its checkpoint and state."""

    def __init__(self, pool: Pool, box: SecretBox) -> None:
        self.pool = pool
        self.box = box

    @translates_errors
    async def job(self, webhook_id: str) -> ReconcileJob | None:
        """The reconciler of a live github webhook with its token opened; None when either is gone."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT r.* FROM webhook_reconcilers r JOIN endpoint_webhooks w ON w.id = r.webhook_id"
                " WHERE r.webhook_id = %s AND w.state = 'live' AND w.source_type = %s",
                (webhook_id, RECONCILE_SOURCE),
            )
            row = await cur.fetchone()
        if row is None:
            return None
        try:
            token: str | None = self.box.open(bytes(row["token_ciphertext"]), token_context(webhook_id))
        except (InvalidTag, ValueError):
            # Sealed under another server key, or damaged: no call is made with a token that is not this one.
            token = None
        return ReconcileJob(
            webhook_id=webhook_id,
            scope_kind=row["scope_kind"],
            scope_name=row["scope_name"],
            hook_id=row["hook_id"],
            api_url=row["api_url"],
            token=token,
            interval_seconds=row["interval_seconds"],
            lookback_hours=row["lookback_hours"],
            temporal_schedule_id=row["temporal_schedule_id"],
            checkpoint_id=row["checkpoint_id"],
            scan_top_id=row["scan_top_id"],
            scan_cursor=row["scan_cursor"],
            backoff_until=row["backoff_until"],
        )

    @translates_errors
    async def webhook_live(self, webhook_id: str) -> bool:
        """Whether the webhook still exists (a reconciler can only be set on a live one)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT 1 FROM endpoint_webhooks WHERE id = %s AND state = 'live'", (webhook_id,))
            return await cur.fetchone() is not None

    @translates_errors
    async def forget(self, webhook_id: str) -> None:
        """Remove the reconciler of a webhook that is gone (its run found it so)."""
        async with self.pool.connection() as conn:
            await conn.execute("DELETE FROM webhook_reconcilers WHERE webhook_id = %s", (webhook_id,))

    @translates_errors
    async def schedules(self) -> list[ScheduleEntry]:
        """Every reconciler's schedule (the worker's start-up sync)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT webhook_id, temporal_schedule_id, interval_seconds, scope_kind, scope_name, hook_id"
                " FROM webhook_reconcilers ORDER BY webhook_id"
            )
            rows = await cur.fetchall()
        return [
            ScheduleEntry(r["webhook_id"], r["temporal_schedule_id"], r["interval_seconds"], schedule_summary(r))
            for r in rows
        ]

    @translates_errors
    async def set_status(
        self, webhook_id: str, status: Status, detail: str | None, *, backoff_until: datetime | None = None
    ) -> None:
        """Record what the reconciler last found (and, when rate limited, until when it makes no call)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE webhook_reconcilers SET status = %s, status_detail = %s, status_at = now(),"
                " backoff_until = %s WHERE webhook_id = %s",
                (status, (detail or "")[:DETAIL_MAX] or None, backoff_until, webhook_id),
            )

    @translates_errors
    async def present(self, webhook_id: str, guids: Iterable[str]) -> set[str]:
        """The guids Switchboard holds for this webhook: an event (the original), or a row waiting in the inbox."""
        keys = {g: key for g in guids if (key := external_id_of(webhook_id, g)) is not None}
        if not keys:
            return set()
        by_key = {k: g for g, k in keys.items()}
        by_workflow = {workflow_id_for(webhook_id, k): g for g, k in keys.items()}
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT external_id AS key FROM events WHERE external_id = ANY(%s) AND webhook_id = %s"
                " AND reroute_of IS NULL"
                " UNION ALL SELECT workflow_id FROM delivery_inbox WHERE workflow_id = ANY(%s)",
                (list(by_key), webhook_id, list(by_workflow)),
            )
            rows = await cur.fetchall()
        found = {by_key.get(r["key"]) or by_workflow.get(r["key"]) for r in rows}
        return {g for g in found if g is not None}

    @translates_errors
    async def examine(
        self,
        webhook_id: str,
        attempts: Sequence[Seen],
        present: set[str],
        *,
        checkpoint: tuple[int | None, int | None, str | None],
    ) -> Examined:
        """Put one page's attempts (newest first) in the ledger and move the scan on, in one transaction.

        A guid Switchboard holds is never missing (and a requested one has arrived). A guid it does not hold is
        missing, unless a redelivery was asked for and GitHub has made no newer attempt since (it is on its way),
        or the newer attempt was delivered. ``checkpoint`` is the scan's new (checkpoint_id, scan_top_id,
        scan_cursor).
        """
        out = Examined()
        newest: dict[str, Seen] = {}
        first: dict[str, datetime] = {}
        for a in attempts:
            if a.guid not in newest or a.attempt_id > newest[a.guid].attempt_id:
                newest[a.guid] = a
            first[a.guid] = min(first.get(a.guid, a.delivered_at), a.delivered_at)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT guid, state, attempt_id, requests, requested_attempt_id, requested_at"
                " FROM webhook_reconcile_deliveries WHERE webhook_id = %s AND guid = ANY(%s) FOR UPDATE",
                (webhook_id, list(newest)),
            )
            known = {r["guid"]: r for r in await cur.fetchall()}
            cur = await conn.execute(
                "SELECT interval_seconds FROM webhook_reconcilers WHERE webhook_id = %s FOR UPDATE", (webhook_id,)
            )
            found = await cur.fetchone()
            if found is None:
                raise NotFound("unknown reconciler")
            interval = timedelta(seconds=found["interval_seconds"])
            for guid, attempt in newest.items():
                row = known.get(guid)
                if guid in present:
                    if row is not None and row["state"] == "requested":
                        await self._settle(conn, webhook_id, guid, "arrived")
                        out.arrived += 1
                    elif row is not None and row["state"] == "missing":
                        # It reached Switchboard without us (a slow original): nothing to ask for.
                        await conn.execute(
                            "DELETE FROM webhook_reconcile_deliveries WHERE webhook_id = %s AND guid = %s",
                            (webhook_id, guid),
                        )
                    continue
                if row is None:
                    await conn.execute(
                        "INSERT INTO webhook_reconcile_deliveries (webhook_id, guid, state, attempt_id, first_at)"
                        " VALUES (%s, %s, 'missing', %s, %s)",
                        (webhook_id, guid, attempt.attempt_id, first[guid]),
                    )
                    out.missing += 1
                elif row["state"] == "missing":
                    await conn.execute(
                        "UPDATE webhook_reconcile_deliveries SET attempt_id = greatest(attempt_id, %s),"
                        " first_at = least(first_at, %s), updated_at = now() WHERE webhook_id = %s AND guid = %s",
                        (attempt.attempt_id, first[guid], webhook_id, guid),
                    )
                elif (
                    row["state"] == "requested"
                    and attempt.attempt_id > (row["requested_attempt_id"] or 0)
                    and not attempt.delivered
                ):
                    # GitHub made the redelivery and it failed too: ask again, later each time, or give up.
                    if row["requests"] >= REQUESTS_MAX:
                        await self._settle(conn, webhook_id, guid, "given_up", f"{REQUESTS_MAX} redeliveries failed")
                        out.given_up += 1
                        continue
                    wait = min(interval * 2 ** max(row["requests"] - 1, 0), BACKOFF_MAX)
                    await conn.execute(
                        "UPDATE webhook_reconcile_deliveries SET state = 'missing', attempt_id = %s,"
                        " not_before = %s::timestamptz + %s, updated_at = now() WHERE webhook_id = %s AND guid = %s",
                        (attempt.attempt_id, row["requested_at"], wait, webhook_id, guid),
                    )
                    out.again += 1
            checkpoint_id, top_id, cursor = checkpoint
            await conn.execute(
                "UPDATE webhook_reconcilers SET checkpoint_id = %s, scan_top_id = %s, scan_cursor = %s,"
                " seen_total = seen_total + %s, missing_total = missing_total + %s,"
                " arrived_total = arrived_total + %s, given_up_total = given_up_total + %s WHERE webhook_id = %s",
                (checkpoint_id, top_id, cursor, len(attempts), out.missing, out.arrived, out.given_up, webhook_id),
            )
        return out

    async def _settle(
        self, conn: AsyncConnection[DictRow], webhook_id: str, guid: str, state: str, detail: str | None = None
    ) -> None:
        await conn.execute(
            "UPDATE webhook_reconcile_deliveries SET state = %s, detail = %s, updated_at = now()"
            " WHERE webhook_id = %s AND guid = %s",
            (state, detail, webhook_id, guid),
        )

    @translates_errors
    async def reset_scan(self, webhook_id: str) -> None:
        """Forget a scan in progress (its cursor was refused): the next page is the newest again."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE webhook_reconcilers SET scan_cursor = NULL, scan_top_id = NULL WHERE webhook_id = %s",
                (webhook_id,),
            )

    @translates_errors
    async def due(self, webhook_id: str, run_id: str, limit: int) -> list[Due]:
        """Missing deliveries to ask for now, oldest first (closest to GitHub's window), none this run asked for."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT guid, attempt_id, requests FROM webhook_reconcile_deliveries"
                " WHERE webhook_id = %s AND state = 'missing' AND not_before <= now()"
                " AND last_run_id IS DISTINCT FROM %s ORDER BY first_at, attempt_id LIMIT %s",
                (webhook_id, run_id, limit),
            )
            rows = await cur.fetchall()
        return [Due(r["guid"], r["attempt_id"], r["requests"]) for r in rows]

    @translates_errors
    async def mark_requested(self, webhook_id: str, due: Due, run_id: str) -> bool:
        """Note a redelivery about to be asked for, before the call (so no retry of this run asks twice); False
        when this run already asked or the delivery is no longer missing."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE webhook_reconcile_deliveries SET state = 'requested', requests = requests + 1,"
                " requested_attempt_id = attempt_id, requested_at = now(), last_run_id = %s, updated_at = now()"
                " WHERE webhook_id = %s AND guid = %s AND state = 'missing' AND last_run_id IS DISTINCT FROM %s"
                " RETURNING guid",
                (run_id, webhook_id, due.guid, run_id),
            )
            taken = await cur.fetchone() is not None
            if taken:
                await conn.execute(
                    "UPDATE webhook_reconcilers SET requested_total = requested_total + 1 WHERE webhook_id = %s",
                    (webhook_id,),
                )
        return taken

    @translates_errors
    async def unmark(self, webhook_id: str, due: Due) -> None:
        """The call did not go through (rate limit, outage): the delivery is missing again, not counted."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE webhook_reconcile_deliveries SET state = 'missing', requests = requests - 1,"
                " requested_attempt_id = NULL, requested_at = NULL, last_run_id = NULL, updated_at = now()"
                " WHERE webhook_id = %s AND guid = %s AND state = 'requested' RETURNING guid",
                (webhook_id, due.guid),
            )
            if await cur.fetchone() is not None:
                await conn.execute(
                    "UPDATE webhook_reconcilers SET requested_total = requested_total - 1 WHERE webhook_id = %s",
                    (webhook_id,),
                )

    @translates_errors
    async def give_up(self, webhook_id: str, guid: str, detail: str) -> None:
        """GitHub will not redeliver this one (e.g. past its window): given up, with its reason."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._settle(conn, webhook_id, guid, "given_up", detail[:DETAIL_MAX])
            await conn.execute(
                "UPDATE webhook_reconcilers SET given_up_total = given_up_total + 1 WHERE webhook_id = %s",
                (webhook_id,),
            )

    @translates_errors
    async def drop_present(self, webhook_id: str, guid: str) -> None:
        """A missing delivery that reached Switchboard meanwhile: nothing to ask for."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM webhook_reconcile_deliveries WHERE webhook_id = %s AND guid = %s AND state = 'missing'",
                (webhook_id, guid),
            )

    @translates_errors
    async def open_requests(self, webhook_id: str, limit: int = 1000) -> list[str]:
        """Guids whose redelivery was asked for and has not been seen arriving, oldest first."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT guid FROM webhook_reconcile_deliveries WHERE webhook_id = %s AND state = 'requested'"
                " ORDER BY requested_at LIMIT %s",
                (webhook_id, limit),
            )
            return [r["guid"] for r in await cur.fetchall()]

    @translates_errors
    async def arrived(self, webhook_id: str, guids: Iterable[str]) -> int:
        """Requested deliveries now held by Switchboard: arrived (confirmed); how many."""
        found = list(guids)
        if not found:
            return 0
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE webhook_reconcile_deliveries SET state = 'arrived', updated_at = now()"
                " WHERE webhook_id = %s AND guid = ANY(%s) AND state = 'requested' RETURNING guid",
                (webhook_id, found),
            )
            n = len(await cur.fetchall())
            await conn.execute(
                "UPDATE webhook_reconcilers SET arrived_total = arrived_total + %s WHERE webhook_id = %s",
                (n, webhook_id),
            )
        return n

    @translates_errors
    async def revive(self, webhook_id: str, interval_seconds: int) -> int:
        """Requested deliveries GitHub shows no attempt for since, long after the request: missing again.

        The request may never have reached GitHub (the worker died between noting it and making the call), or
        GitHub took it and sent nothing. Asked again, within the same cap; how many.
        """
        stale = max(timedelta(seconds=3 * interval_seconds), STALE_MIN)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE webhook_reconcile_deliveries SET state = 'missing', not_before = now(), updated_at = now()"
                " WHERE webhook_id = %s AND state = 'requested' AND attempt_id = requested_attempt_id"
                " AND requested_at < now() - %s AND requests < %s RETURNING guid",
                (webhook_id, stale, REQUESTS_MAX),
            )
            return len(await cur.fetchall())

    @translates_errors
    async def expire(self, webhook_id: str, lookback_hours: int) -> int:
        """Deliveries first tried before the lookback that never arrived: given up (GitHub will not redeliver
        them); settled rows long past it are removed. How many were given up now."""
        window = timedelta(hours=lookback_hours)
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "UPDATE webhook_reconcile_deliveries SET state = 'given_up', updated_at = now(),"
                " detail = coalesce(detail, 'past the lookback: GitHub no longer redelivers it')"
                " WHERE webhook_id = %s AND state IN ('missing', 'requested') AND first_at < now() - %s"
                " RETURNING guid",
                (webhook_id, window),
            )
            n = len(await cur.fetchall())
            await conn.execute(
                "UPDATE webhook_reconcilers SET given_up_total = given_up_total + %s WHERE webhook_id = %s",
                (n, webhook_id),
            )
            await conn.execute(
                "DELETE FROM webhook_reconcile_deliveries WHERE webhook_id = %s AND state IN ('arrived', 'given_up')"
                " AND first_at < now() - %s",
                (webhook_id, window + timedelta(days=1)),
            )
        return n

    @translates_errors
    async def finish(
        self, webhook_id: str, run_id: str, status: Status, detail: str | None, counts: dict[str, Any]
    ) -> None:
        """Record a run's outcome and counts on the reconciler (get_webhook_reconciler shows them)."""
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE webhook_reconcilers SET last_run_id = %s, last_run_at = now(), last_run = %s,"
                " status = %s, status_detail = %s, status_at = now(),"
                " backoff_until = CASE WHEN %s::text = 'rate_limited' THEN backoff_until END WHERE webhook_id = %s",
                (run_id, Jsonb(counts), status, (detail or "")[:DETAIL_MAX] or None, status, webhook_id),
            )
