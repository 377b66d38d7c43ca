-- Switchboard schema, version 1: identities, endpoints, webhooks, routes, events, todos, once-claims.

CREATE TABLE humans (
    id          text PRIMARY KEY,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agents (
    id              text PRIMARY KEY,
    owner_human_id  text NOT NULL REFERENCES humans (id),
    name            text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX agents_owner_idx ON agents (owner_human_id);

-- An endpoint is a credential plus an immutable scope; a changed scope is a new endpoint.
CREATE TABLE endpoints (
    id                    text PRIMARY KEY,
    agent_id              text NOT NULL REFERENCES agents (id),
    credential_hash       bytea NOT NULL UNIQUE,
    credential_prefix     text NOT NULL,
    scope_queues          text[] NOT NULL,
    scope_verbs           text[] NOT NULL,
    webhook_max           integer NOT NULL CHECK (webhook_max >= 0),
    webhook_source_types  text[] NOT NULL,
    webhook_queues        text[] NOT NULL,
    state                 text NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'revoked')),
    created_at            timestamptz NOT NULL DEFAULT now(),
    revoked_at            timestamptz
);
CREATE INDEX endpoints_agent_idx ON endpoints (agent_id);

CREATE TABLE endpoint_webhooks (
    id                      text PRIMARY KEY,
    endpoint_id             text NOT NULL REFERENCES endpoints (id),
    source_type             text NOT NULL,
    target_queue            text NOT NULL,
    trust_mode              text NOT NULL CHECK (trust_mode IN ('signed', 'token')),
    ingest_token            text NOT NULL UNIQUE,
    secret_ciphertext       bytea,
    routing_rules           jsonb NOT NULL DEFAULT '[]'::jsonb,
    routing_default_action  jsonb,
    routing_params          jsonb,
    config                  jsonb NOT NULL DEFAULT '{}'::jsonb,
    state                   text NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'deleted')),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    deleted_at              timestamptz,
    CHECK ((trust_mode = 'signed') = (secret_ciphertext IS NOT NULL))
);
CREATE INDEX endpoint_webhooks_endpoint_idx ON endpoint_webhooks (endpoint_id) WHERE state = 'live';

CREATE TABLE webhook_routes (
    webhook_id          text NOT NULL REFERENCES endpoint_webhooks (id) ON DELETE CASCADE,
    target_endpoint_id  text NOT NULL REFERENCES endpoints (id),
    granted_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (webhook_id, target_endpoint_id)
);

-- Directional: from_human consents to hand work to to_human once to_human approved.
CREATE TABLE friend_edges (
    from_human_id  text NOT NULL REFERENCES humans (id),
    to_human_id    text NOT NULL REFERENCES humans (id),
    state          text NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'revoked')),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (from_human_id, to_human_id),
    CHECK (from_human_id <> to_human_id)
);

CREATE TABLE events (
    id              text PRIMARY KEY,
    webhook_id      text NOT NULL,
    endpoint_id     text NOT NULL,
    source          text NOT NULL,
    kind            text,
    external_id     text NOT NULL,
    trust_mode      text NOT NULL,
    verified        boolean NOT NULL,
    verify_detail   text,
    content_type    text,
    headers         jsonb NOT NULL DEFAULT '{}'::jsonb,
    payload         bytea NOT NULL,
    payload_size    integer NOT NULL,
    source_ip       text,
    received_at     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    routing_trace   jsonb NOT NULL,
    disposition     text NOT NULL CHECK (disposition IN ('routed', 'dropped', 'repeat', 'faulted')),
    todo_ids        text[] NOT NULL DEFAULT '{}',
    workflow_id     text
);
-- The dedup slot: one event per (owning endpoint, source, external id), whatever its routing outcome.
CREATE UNIQUE INDEX events_dedup_idx ON events (endpoint_id, source, external_id);
CREATE INDEX events_webhook_recent_idx ON events (webhook_id, received_at DESC, id DESC);
CREATE INDEX events_received_idx ON events (received_at);

CREATE TABLE todos (
    id                text PRIMARY KEY,
    endpoint_id       text NOT NULL,
    queue             text NOT NULL,
    source            text NOT NULL,
    kind              text,
    title             text NOT NULL,
    payload           jsonb,
    event_id          text,
    idempotency_key   text NOT NULL,
    state             text NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'claimed', 'done', 'failed', 'canceled')),
    owner             text,
    lease_expires_at  timestamptz,
    attempt           integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL DEFAULT 5,
    result            jsonb,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    claimed_at        timestamptz,
    completed_at      timestamptz,
    next_retry_at     timestamptz,
    routing_trace     jsonb,
    work_order        jsonb,
    seq               bigserial NOT NULL
);
-- Live todos are unique per endpoint and idempotency key; done and dead-lettered rows free the slot.
CREATE UNIQUE INDEX todos_live_idem_idx ON todos (endpoint_id, idempotency_key)
    WHERE state NOT IN ('done', 'canceled') AND NOT (state = 'failed' AND next_retry_at IS NULL);
CREATE INDEX todos_claimable_idx ON todos (endpoint_id, queue, seq) WHERE state = 'pending';
CREATE INDEX todos_lease_idx ON todos (lease_expires_at) WHERE state = 'claimed';
CREATE INDEX todos_retry_idx ON todos (next_retry_at) WHERE state = 'failed' AND next_retry_at IS NOT NULL;
CREATE INDEX todos_event_idx ON todos (event_id);
CREATE INDEX todos_list_idx ON todos (endpoint_id, created_at DESC, id DESC);

-- At-most-once claims outlive the events that made them: event_id is deliberately not a foreign key.
CREATE TABLE routing_once (
    webhook_id  text NOT NULL,
    once_key    text NOT NULL,
    event_id    text NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (webhook_id, once_key)
);
