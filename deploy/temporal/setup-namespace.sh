#!/usr/bin/env bash
# One-shot setup job for the bundled Temporal server (docker-compose.yml service `temporal-setup`): waits until the
# server serves, creates Switchboard's namespace with a retention of at least TEMPORAL_RETENTION (raising a shorter
# one, never lowering), then registers the search attributes (register-search-attributes.sh) and exits 0.
# Runs in the temporalio/admin-tools image (temporal CLI, jq); the CLI reads TEMPORAL_ADDRESS and its TLS variables.
#
#   TEMPORAL_ADDRESS    frontend host:port        (default temporal:7233)
#   TEMPORAL_NAMESPACE  namespace                 (default "default")
#   TEMPORAL_RETENTION  closed-workflow retention, in hours (default 720h = 30 days, Switchboard's event retention:
#                       a delivery stays auditable in the Temporal UI as long as its event is kept)
set -euo pipefail

export TEMPORAL_ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"
export TEMPORAL_NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
RETENTION="${TEMPORAL_RETENTION:-720h}"
WAIT_SECONDS="${WAIT_SECONDS:-180}"

log() { printf '[temporal-setup] %s\n' "$*" >&2; }

if [[ ! $RETENTION =~ ^[0-9]+h$ ]]; then
  log "TEMPORAL_RETENTION must be a number of hours such as 720h, not '$RETENTION'"
  exit 1
fi
want=$(( ${RETENTION%h} * 3600 ))

deadline=$((SECONDS + WAIT_SECONDS))
until temporal operator cluster health 2>/dev/null | grep -q SERVING; do
  if (( SECONDS >= deadline )); then
    log "Temporal at $TEMPORAL_ADDRESS not serving after ${WAIT_SECONDS}s"
    temporal operator cluster health >&2 || true
    exit 1
  fi
  log "waiting for Temporal at $TEMPORAL_ADDRESS"
  sleep 2
done

if described="$(temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" -o json 2>/dev/null)"; then
  # Protobuf JSON spells the duration "2592000s".
  have="$(jq -r '.config.workflowExecutionRetentionTtl // empty' <<< "$described")"
  have="${have%s}"
  if [[ ! $have =~ ^[0-9]+$ ]]; then
    log "namespace '$TEMPORAL_NAMESPACE' exists; its retention could not be read, left as it is"
  elif (( have < want )); then
    log "namespace '$TEMPORAL_NAMESPACE' keeps histories ${have}s; raising to $RETENTION"
    temporal operator namespace update --namespace "$TEMPORAL_NAMESPACE" --retention "$RETENTION"
  else
    log "namespace '$TEMPORAL_NAMESPACE' exists (retention ${have}s)"
  fi
else
  log "creating namespace '$TEMPORAL_NAMESPACE' (retention $RETENTION)"
  temporal operator namespace create --namespace "$TEMPORAL_NAMESPACE" --retention "$RETENTION" \
    --description "Switchboard deliveries"
fi

exec bash "$(dirname "$0")/register-search-attributes.sh"
