-- Switchboard schema, version 7: re-routed events, lookup by the producer's delivery id, canceled todos.

-- A re-route (reroute_webhook_event(s)) routes a stored delivery again as a new event row naming the original
-- here; the original row never changes. Always the original delivery's own event (a re-route of a re-route
-- names the same original), so "every event of one delivery" is the original plus the rows naming it. Not a
-- foreign key: retention prunes by received_at, which a re-route copies from its original, in any order.
ALTER TABLE events ADD COLUMN reroute_of text;
CREATE INDEX events_reroute_of_idx ON events (reroute_of, created_at) WHERE reroute_of IS NOT NULL;

-- list_webhook_events {delivery_id}: the idempotency key "{webhook_id}:{delivery_id}" of each of the caller's
-- webhooks, looked up directly (the dedup index leads with the endpoint and source, which a lookup lacks).
CREATE INDEX events_external_id_idx ON events (external_id);

-- cancel_todo's optional reason, shown on the todo (a worker's own error stays in last_error).
ALTER TABLE todos ADD COLUMN cancel_reason text;
