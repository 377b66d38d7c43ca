-- Switchboard schema, version 2: webhook teardown drops the secret; retention finds terminal todos fast.

-- A deleted webhook holds no secret (delete_webhook wipes it), so the secret/trust check binds live rows only.
ALTER TABLE endpoint_webhooks DROP CONSTRAINT endpoint_webhooks_check;
ALTER TABLE endpoint_webhooks ADD CONSTRAINT endpoint_webhooks_secret_check
    CHECK (state = 'deleted' OR (trust_mode = 'signed') = (secret_ciphertext IS NOT NULL));

-- Retention prunes terminal todos (done, canceled, dead letters) by when they finished.
CREATE INDEX todos_terminal_idx ON todos ((coalesce(completed_at, updated_at)))
    WHERE state IN ('done', 'canceled') OR (state = 'failed' AND next_retry_at IS NULL);
