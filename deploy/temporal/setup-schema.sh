#!/usr/bin/env bash
# One-shot schema job for the bundled Temporal server (docker-compose.yml service `temporal-schema`): creates any
# missing database and applies or upgrades Temporal's two PostgreSQL schemas with temporal-sql-tool, then exits 0.
# Runs in the temporalio/admin-tools image, whose tool and schema files match the temporalio/server image of the
# same version. It does what temporalio/auto-setup did at every start (that image is no longer built) and is
# idempotent: setup-schema leaves an existing schema alone and update-schema applies only newer versions.
#
# Environment (the server's own names, so one set of values serves both containers):
#   POSTGRES_SEEDS, DB_PORT (5432), POSTGRES_USER, SQL_PASSWORD   connection; temporal-sql-tool reads SQL_PASSWORD
#   DBNAME (temporal), VISIBILITY_DBNAME (temporal_visibility)    the two databases
set -euo pipefail

: "${POSTGRES_SEEDS:?POSTGRES_SEEDS must be set}"
: "${POSTGRES_USER:?POSTGRES_USER must be set}"
: "${SQL_PASSWORD:?SQL_PASSWORD must be set}"
DB_PORT="${DB_PORT:-5432}"
DBNAME="${DBNAME:-temporal}"
VISIBILITY_DBNAME="${VISIBILITY_DBNAME:-temporal_visibility}"
SCHEMA_ROOT="${SCHEMA_ROOT:-/etc/temporal/schema/postgresql/v12}"
WAIT_SECONDS="${WAIT_SECONDS:-120}"

log() { printf '[temporal-schema] %s\n' "$*" >&2; }

sql_tool() {
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$DB_PORT" -u "$POSTGRES_USER" "$@"
}

database_exists() {
  PGPASSWORD="$SQL_PASSWORD" psql -h "$POSTGRES_SEEDS" -p "$DB_PORT" -U "$POSTGRES_USER" -d postgres \
    -v ON_ERROR_STOP=1 -v name="$1" -tA <<< "SELECT 1 FROM pg_database WHERE datname = :'name'" | grep -qx 1
}

deadline=$((SECONDS + WAIT_SECONDS))
until pg_isready -q -h "$POSTGRES_SEEDS" -p "$DB_PORT" -U "$POSTGRES_USER"; do
  if (( SECONDS >= deadline )); then
    log "PostgreSQL at $POSTGRES_SEEDS:$DB_PORT not ready after ${WAIT_SECONDS}s"
    exit 1
  fi
  sleep 1
done

for pair in "$DBNAME:temporal" "$VISIBILITY_DBNAME:visibility"; do
  db="${pair%%:*}"
  dir="$SCHEMA_ROOT/${pair##*:}/versioned"
  if database_exists "$db"; then
    log "database $db exists"
  else
    # deploy/postgres/initdb.d creates both on a fresh volume; this covers a volume initialised before that.
    log "creating database $db (needs CREATEDB for role $POSTGRES_USER)"
    sql_tool --db "$db" create
  fi
  sql_tool --db "$db" setup-schema -v 0.0
  sql_tool --db "$db" update-schema -d "$dir"
  log "schema of $db is current ($dir)"
done
