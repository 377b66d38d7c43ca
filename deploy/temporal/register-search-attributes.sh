#!/usr/bin/env bash
# Registers the custom search attributes Switchboard's workflows carry (RouteDelivery, re-routes), all Keyword.
# Idempotent: attributes already present are skipped, and an "already exists" answer counts as success.
#
# Needs the `temporal` CLI (https://docs.temporal.io/cli). Connection settings come from the CLI's own
# environment variables, so this works unchanged against a self-hosted cluster or Temporal Cloud:
#   TEMPORAL_ADDRESS    host:port of the frontend      (default temporal:7233, the compose service)
#   TEMPORAL_NAMESPACE  namespace Switchboard uses     (default "default")
#   TEMPORAL_TLS_CERT / TEMPORAL_TLS_KEY / TEMPORAL_API_KEY ... as the CLI documents
# Usage: TEMPORAL_ADDRESS=temporal.example.internal:7233 TEMPORAL_NAMESPACE=switchboard \
#          bash deploy/temporal/register-search-attributes.sh
set -euo pipefail

export TEMPORAL_ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"
export TEMPORAL_NAMESPACE="${TEMPORAL_NAMESPACE:-default}"
WAIT_SECONDS="${WAIT_SECONDS:-180}"

ATTRIBUTES=(
  SwitchboardWebhookId
  SwitchboardSource
  SwitchboardKind
  SwitchboardDecision
  SwitchboardRuleId
  SwitchboardDeliveryId
  SwitchboardEventId
  SwitchboardRerouteOf
)

log() { printf '[register-search-attributes] %s\n' "$*" >&2; }

list_attributes() {
  temporal operator search-attribute list --namespace "$TEMPORAL_NAMESPACE" 2>&1
}

# The namespace may still be on its way (setup-namespace.sh, or an operator creating it); wait for it.
deadline=$((SECONDS + WAIT_SECONDS))
until temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" > /dev/null 2>&1; do
  if (( SECONDS >= deadline )); then
    log "namespace '$TEMPORAL_NAMESPACE' not reachable at $TEMPORAL_ADDRESS after ${WAIT_SECONDS}s"
    temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" >&2 || true
    exit 1
  fi
  log "waiting for namespace '$TEMPORAL_NAMESPACE' at $TEMPORAL_ADDRESS"
  sleep 2
done

existing="$(list_attributes)"
for name in "${ATTRIBUTES[@]}"; do
  if grep -qw -- "$name" <<< "$existing"; then
    log "$name already registered"
    continue
  fi
  if out="$(temporal operator search-attribute create --namespace "$TEMPORAL_NAMESPACE" \
        --name "$name" --type Keyword 2>&1)"; then
    log "$name registered (Keyword)"
  elif grep -qi 'already exists' <<< "$out"; then
    log "$name already registered"
  else
    log "registering $name failed:"
    printf '%s\n' "$out" >&2
    exit 1
  fi
done

all_present() {
  existing="$(list_attributes)" || return 1
  local name
  for name in "${ATTRIBUTES[@]}"; do
    grep -qw -- "$name" <<< "$existing" || return 1
  done
}

# Verify every attribute is visible before reporting success (the namespace cache refreshes lazily).
deadline=$((SECONDS + WAIT_SECONDS))
until all_present; do
  if (( SECONDS >= deadline )); then
    log "search attributes not all visible after ${WAIT_SECONDS}s:"
    printf '%s\n' "$existing" >&2
    exit 1
  fi
  sleep 2
done
log "all ${#ATTRIBUTES[@]} search attributes present in namespace '$TEMPORAL_NAMESPACE'"
