-- Switchboard schema, version 5: accept-first inbox, per-webhook pacing, the run that committed an event,
-- exact schedule fire counts.

-- Verified deliveries Temporal could not take yet (unreachable, slow, past the API's capacity) or that a
-- webhook's rate defers. Keyed by the delivery's workflow id, so a producer's retry while the row waits adds
-- nothing; a relay in every worker process starts the workflow and deletes the row once Temporal took it.
CREATE TABLE delivery_inbox (
    workflow_id  text PRIMARY KEY,
    webhook_id   text NOT NULL,
    -- The RouteDelivery input (DeliveryInput) exactly as the receiver built it.
    delivery     jsonb NOT NULL,
    reason       text NOT NULL CHECK (reason IN ('temporal_unavailable', 'admission', 'rate')),
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    -- Not claimed before this time: a webhook's pacing slot, or a retry after a refused start.
    release_at   timestamptz NOT NULL DEFAULT now(),
    attempts     integer NOT NULL DEFAULT 0,
    last_error   text
);
CREATE INDEX delivery_inbox_release_idx ON delivery_inbox (release_at, enqueued_at);

-- Per-webhook pacing (generic cell rate algorithm): the theoretical arrival time of the next delivery.
CREATE TABLE webhook_pace (
    webhook_id  text PRIMARY KEY,
    tat         timestamptz NOT NULL
);

-- A webhook's own rate (deliveries per second) overriding the operator default; NULL = the default,
-- 0 = unpaced.
ALTER TABLE endpoint_webhooks ADD COLUMN rate_per_second double precision
    CHECK (rate_per_second IS NULL OR rate_per_second >= 0);

-- The RouteDelivery run that committed the event: a commit retried inside that run recognises its own work.
ALTER TABLE events ADD COLUMN workflow_run_id text;

-- One row per counted fire, so a retried record_fire cannot count a fire twice.
CREATE TABLE schedule_fires (
    schedule_id  text NOT NULL,
    event_id     text NOT NULL,
    PRIMARY KEY (schedule_id, event_id)
);
