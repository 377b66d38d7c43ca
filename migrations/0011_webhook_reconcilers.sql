-- Switchboard schema, version 11: reconciliation of github webhooks against GitHub's own delivery log.

-- One reconciler per github webhook (set_webhook_reconciler): which GitHub hook's deliveries to read, the token
-- that reads them (sealed under the server key with the webhook id as associated data, like webhook secrets;
-- never returned by a verb), the checkpoint of the scan, and the state the last run left.
CREATE TABLE webhook_reconcilers (
    webhook_id            text PRIMARY KEY REFERENCES endpoint_webhooks (id) ON DELETE CASCADE,
    scope_kind            text NOT NULL CHECK (scope_kind IN ('repo', 'org', 'app')),
    -- "owner/name" for a repository hook, the organization for an organization hook, NULL for the app's hook.
    scope_name            text CHECK ((scope_kind = 'app') = (scope_name IS NULL)),
    hook_id               bigint CHECK ((scope_kind = 'app') = (hook_id IS NULL)),
    api_url               text NOT NULL,
    token_ciphertext      bytea NOT NULL,
    interval_seconds      integer NOT NULL CHECK (interval_seconds > 0),
    -- GitHub redelivers deliveries of the past three days only.
    lookback_hours        integer NOT NULL CHECK (lookback_hours BETWEEN 1 AND 72),
    temporal_schedule_id  text NOT NULL UNIQUE,
    updated_by            text NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- The checkpoint. GitHub lists a hook's delivery attempts newest first; every attempt whose id is at or below
    -- checkpoint_id has been examined. A scan in progress (it stopped at a run's page limit) continues at
    -- scan_cursor, and moves the checkpoint to scan_top_id (its newest attempt) once it reaches the checkpoint.
    checkpoint_id         bigint,
    scan_top_id           bigint,
    scan_cursor           text,
    -- What the last run found: ok, or why it could not read or redeliver (rate_limited, unauthorized, forbidden,
    -- not_found, unavailable, error); pending before the first run. No call is made before backoff_until.
    status                text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'ok', 'rate_limited', 'unauthorized', 'forbidden', 'not_found',
                          'unavailable', 'error')),
    status_detail         text,
    status_at             timestamptz,
    backoff_until         timestamptz,
    last_run_id           text,
    last_run_at           timestamptz,
    -- The last run's counts (seen, missing, requested, arrived, given_up, pages, …), as its history shows them.
    last_run              jsonb,
    seen_total            bigint NOT NULL DEFAULT 0,
    missing_total         bigint NOT NULL DEFAULT 0,
    requested_total       bigint NOT NULL DEFAULT 0,
    arrived_total         bigint NOT NULL DEFAULT 0,
    given_up_total        bigint NOT NULL DEFAULT 0
);

-- The deliveries a reconciler found missing (GitHub has them, Switchboard has no event, inbox row or running
-- workflow for their guid) and what became of each: requested (a redelivery asked for), arrived (the redelivery
-- reached Switchboard), given_up (past the lookback, where GitHub no longer redelivers).
CREATE TABLE webhook_reconcile_deliveries (
    webhook_id            text NOT NULL REFERENCES webhook_reconcilers (webhook_id) ON DELETE CASCADE,
    guid                  text NOT NULL,
    state                 text NOT NULL CHECK (state IN ('missing', 'requested', 'arrived', 'given_up')),
    -- GitHub's newest known attempt of this guid (a redelivery names an attempt) and when it first tried.
    attempt_id            bigint NOT NULL,
    first_at              timestamptz NOT NULL,
    requests              integer NOT NULL DEFAULT 0,
    requested_attempt_id  bigint,
    requested_at          timestamptz,
    -- Not asked for again before this: a failed redelivery backs off, doubling with each request.
    not_before            timestamptz NOT NULL DEFAULT now(),
    -- The run that last asked for it: never twice in one run.
    last_run_id           text,
    detail                text,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (webhook_id, guid)
);
CREATE INDEX webhook_reconcile_deliveries_due_idx ON webhook_reconcile_deliveries (webhook_id, first_at)
    WHERE state = 'missing';
