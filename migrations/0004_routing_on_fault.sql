-- Switchboard schema, version 4: what a rule fault does to a delivery, saved with the rules.
-- 'continue' keeps SPEC-0020's no-match semantics; 'hold' stores the event as faulted and mints nothing.
ALTER TABLE endpoint_webhooks ADD COLUMN routing_on_fault text NOT NULL DEFAULT 'continue'
    CHECK (routing_on_fault IN ('continue', 'hold'));
