#!/usr/bin/env bash
# Runs once, when the postgres container initialises an empty data volume
# (/docker-entrypoint-initdb.d). Creates:
#   role switchboard  -> owns database switchboard                        (SWITCHBOARD_DATABASE_URL)
#   role temporal     -> owns databases temporal and temporal_visibility  (the temporal-schema job
#                        applies Temporal's schemas: deploy/temporal/setup-schema.sh)
# Neither role is a superuser and neither can connect to the other's databases.
# Changing the passwords later means ALTER ROLE by hand: this script does not run again.
set -euo pipefail

: "${SWITCHBOARD_DB_PASSWORD:?SWITCHBOARD_DB_PASSWORD must be set}"
: "${TEMPORAL_DB_PASSWORD:?TEMPORAL_DB_PASSWORD must be set}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "${POSTGRES_DB:-$POSTGRES_USER}" \
    -v switchboard_password="$SWITCHBOARD_DB_PASSWORD" \
    -v temporal_password="$TEMPORAL_DB_PASSWORD" <<'SQL'
CREATE ROLE switchboard LOGIN PASSWORD :'switchboard_password';
CREATE DATABASE switchboard OWNER switchboard;
REVOKE ALL ON DATABASE switchboard FROM PUBLIC;

CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
REVOKE ALL ON DATABASE temporal FROM PUBLIC;
CREATE DATABASE temporal_visibility OWNER temporal;
REVOKE ALL ON DATABASE temporal_visibility FROM PUBLIC;
SQL
