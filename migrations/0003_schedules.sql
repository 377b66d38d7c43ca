-- Switchboard schema, version 3: generic collectors, schedules, entity-level coalescing.

-- Schedule fires enter through an internal webhook (source_type 'schedule'): switchboard is the producer,
-- so its trust mode is neither a signature nor a URL token.
ALTER TABLE endpoint_webhooks DROP CONSTRAINT endpoint_webhooks_trust_mode_check;
ALTER TABLE endpoint_webhooks ADD CONSTRAINT endpoint_webhooks_trust_mode_check
    CHECK (trust_mode IN ('signed', 'token', 'internal'));

-- A generic collector's optional HMAC secret (graduated trust), sealed like signing secrets. Its own column:
-- a token-trust webhook has no signing secret, and the collector secret must never verify as one.
ALTER TABLE endpoint_webhooks ADD COLUMN collector_secret_ciphertext bytea;

-- Coalescing: the subject a coalescing todo was minted for, and the events that updated it since.
ALTER TABLE todos ADD COLUMN subject_key text;
ALTER TABLE todos ADD COLUMN update_event_ids text[] NOT NULL DEFAULT '{}';
CREATE INDEX todos_open_subject_idx ON todos (endpoint_id, queue, subject_key)
    WHERE subject_key IS NOT NULL AND state IN ('pending', 'claimed');

-- One row per agent-created schedule; the Temporal Schedule of the same id does the ticking.
CREATE TABLE schedules (
    id                    text PRIMARY KEY,
    endpoint_id           text NOT NULL REFERENCES endpoints (id),
    -- The webhook a fire is delivered through: the caller's own, or the schedule's internal one.
    webhook_id            text NOT NULL REFERENCES endpoint_webhooks (id),
    target                text NOT NULL CHECK (target IN ('webhook', 'queue')),
    cron                  text NOT NULL,
    timezone              text NOT NULL,
    title                 text NOT NULL,
    payload               jsonb,
    temporal_schedule_id  text NOT NULL UNIQUE,
    state                 text NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'deleted')),
    created_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz,
    fire_count            integer NOT NULL DEFAULT 0,
    last_fired_at         timestamptz,
    last_event_id         text
);
CREATE INDEX schedules_endpoint_idx ON schedules (endpoint_id, created_at) WHERE state = 'live';
