-- Switchboard schema, version 8: LLM triage (SPEC-0020 Phase 2): the provider registry, per-webhook triage
-- configuration and the budget counters.

-- Model providers an operator registered (set_llm_provider). The key is sealed under the server key with the
-- provider's name as associated data (store/crypto.py), like webhook secrets; it is never returned by a verb.
-- The built-in provider "embedded" is not a row: it exists where the optional extra is installed.
CREATE TABLE llm_providers (
    name                text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$' AND name <> 'embedded'),
    base_url            text NOT NULL,
    api_key_ciphertext  bytea,
    timeout_seconds     double precision NOT NULL CHECK (timeout_seconds > 0),
    models              text[] NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- One webhook's triage stage (set_llm_triage). The provider is named, not a foreign key: an operator may
-- delete a provider at once (egress control), and the stage then takes the default with llm_error.
-- include_payload_* record who enabled full payload text and when (SPEC-0020 "Egress control").
CREATE TABLE webhook_llm_triage (
    webhook_id                  text PRIMARY KEY REFERENCES endpoint_webhooks (id) ON DELETE CASCADE,
    provider                    text NOT NULL,
    model                       text NOT NULL,
    queues                      jsonb NOT NULL,
    threshold                   double precision NOT NULL CHECK (threshold >= 0 AND threshold <= 1),
    per_minute                  integer NOT NULL CHECK (per_minute >= 0),
    per_day                     integer NOT NULL CHECK (per_day >= 0),
    include_payload             boolean NOT NULL DEFAULT false,
    include_payload_set_at      timestamptz,
    include_payload_set_by      text,
    timeout_seconds             double precision CHECK (timeout_seconds > 0),
    updated_by                  text NOT NULL,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);

-- Triage calls counted per window: scope is 'endpoint:<id>' (the owner endpoint's total, capped by the operator
-- ceilings) or 'webhook:<id>' (that webhook's own per_minute/per_day). window_start is the UTC minute or day.
CREATE TABLE llm_budget_usage (
    scope         text NOT NULL,
    window_kind   text NOT NULL CHECK (window_kind IN ('minute', 'day')),
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, window_kind, window_start)
);

-- Take one triage call from all four windows (webhook minute/day, endpoint minute/day) or from none: the
-- rows are created if missing, locked in one fixed order (so concurrent takers never deadlock), checked,
-- and incremented together. Returns NULL when taken, else the first exhausted window, e.g. 'webhook:day'.
-- One statement for the caller (SELECT llm_budget_take(...)), so a take is atomic whatever runs beside it.
CREATE FUNCTION llm_budget_take(
    p_endpoint text, p_webhook text,
    p_webhook_minute integer, p_webhook_day integer,
    p_endpoint_minute integer, p_endpoint_day integer
) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_minute timestamptz := date_trunc('minute', now());
    v_day    timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    v_rows   record;
    v_limit  integer;
BEGIN
    INSERT INTO llm_budget_usage (scope, window_kind, window_start)
    VALUES ('webhook:' || p_webhook, 'minute', v_minute), ('webhook:' || p_webhook, 'day', v_day),
           ('endpoint:' || p_endpoint, 'minute', v_minute), ('endpoint:' || p_endpoint, 'day', v_day)
    ON CONFLICT DO NOTHING;
    FOR v_rows IN
        SELECT u.scope, u.window_kind, u.used FROM llm_budget_usage u
        WHERE (u.scope, u.window_kind, u.window_start) IN (
            ('webhook:' || p_webhook, 'minute', v_minute), ('webhook:' || p_webhook, 'day', v_day),
            ('endpoint:' || p_endpoint, 'minute', v_minute), ('endpoint:' || p_endpoint, 'day', v_day))
        ORDER BY u.scope, u.window_kind
        FOR UPDATE
    LOOP
        -- Assigned first: inside IF, plpgsql would end the condition at the CASE's first THEN.
        v_limit := CASE
            WHEN v_rows.scope LIKE 'webhook:%' AND v_rows.window_kind = 'minute' THEN p_webhook_minute
            WHEN v_rows.scope LIKE 'webhook:%' THEN p_webhook_day
            WHEN v_rows.window_kind = 'minute' THEN p_endpoint_minute
            ELSE p_endpoint_day END;
        IF v_rows.used >= v_limit THEN
            RETURN split_part(v_rows.scope, ':', 1) || ':' || v_rows.window_kind;
        END IF;
    END LOOP;
    UPDATE llm_budget_usage SET used = used + 1
    WHERE (scope, window_kind, window_start) IN (
        ('webhook:' || p_webhook, 'minute', v_minute), ('webhook:' || p_webhook, 'day', v_day),
        ('endpoint:' || p_endpoint, 'minute', v_minute), ('endpoint:' || p_endpoint, 'day', v_day));
    -- Spent windows of these scopes are of no further use: each take clears its own, so the table stays small.
    DELETE FROM llm_budget_usage
    WHERE scope IN ('webhook:' || p_webhook, 'endpoint:' || p_endpoint)
      AND ((window_kind = 'minute' AND window_start < v_minute) OR (window_kind = 'day' AND window_start < v_day));
    RETURN NULL;
END;
$$;
