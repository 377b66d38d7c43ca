"""Migrations apply to an empty database, twice, and leave the dedup indexes in place."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql

from store.db import migrate, migration_files


def test_migrations_apply_twice_from_empty(pg_server: Any) -> None:
    name = f"sb_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.get_uri(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = pg_server.get_uri(name)
    first = migrate(url)
    assert first == [v for v, _ in migration_files()]
    assert migrate(url) == []
    with psycopg.connect(url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
        ledger = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert {
        "humans",
        "agents",
        "endpoints",
        "endpoint_webhooks",
        "webhook_routes",
        "friend_edges",
        "events",
        "todos",
        "routing_once",
        "schema_migrations",
    } <= tables
    assert {"events_dedup_idx", "todos_live_idem_idx"} <= indexes
    assert ledger == first
