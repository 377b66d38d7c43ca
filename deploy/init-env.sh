#!/bin/sh
# Creates the compose stack's secrets once: a `.env` file next to docker-compose.yml (mode 600) holding the
# admin token, the key that seals secrets at rest and the three database passwords, each random. Run it before
# the first `docker compose up`. It never changes a file that exists: the same values serve every later `up`,
# which is what keeps stored webhook secrets decryptable (a new SWITCHBOARD_SECRET_KEY makes Switchboard refuse
# to start, see docs/production.md §7). Back the file up with your other secrets; never commit it.
#
#   sh deploy/init-env.sh            # writes ./.env (next to docker-compose.yml) unless it exists
#   sh deploy/init-env.sh path/.env  # elsewhere (compose: docker compose --env-file path/.env …)
set -eu

target="${1:-$(dirname "$0")/../.env}"

if [ -e "$target" ]; then
  echo "init-env: $target exists; kept as it is (its secrets seal what the stack stored)" >&2
  exit 0
fi

# Hex only: the database passwords go into a URL, and hex needs no escaping anywhere.
random_hex() {
  od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'
}

umask 077
tmp="$target.tmp.$$"
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<EOF
# Switchboard compose secrets, created once by deploy/init-env.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ).
# Keep this file and back it up: a new SWITCHBOARD_SECRET_KEY cannot open the secrets stored under this one, and
# the database passwords were set in the database volume on its first start.
SWITCHBOARD_ADMIN_TOKEN=sba_$(random_hex 24)
SWITCHBOARD_SECRET_KEY=$(random_hex 32)
POSTGRES_PASSWORD=$(random_hex 24)
SWITCHBOARD_DB_PASSWORD=$(random_hex 24)
TEMPORAL_DB_PASSWORD=$(random_hex 24)
EOF
# Never over a file that appeared meanwhile (a second run at the same moment).
if ! ln "$tmp" "$target" 2>/dev/null; then
  echo "init-env: $target exists; kept as it is" >&2
  exit 0
fi
echo "init-env: wrote $target (mode 600); keep it, and back it up with your other secrets" >&2
