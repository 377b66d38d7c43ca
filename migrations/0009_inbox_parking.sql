-- Switchboard schema, version 9: inbox rows are isolated from each other.

-- A row whose start keeps failing while Temporal answers other starts is parked: kept with its last error, out
-- of every relay's claims, counted (switchboard_inbox_parked) and alerted, until an operator requeues it.
ALTER TABLE delivery_inbox ADD COLUMN parked_at timestamptz;

DROP INDEX delivery_inbox_release_idx;
CREATE INDEX delivery_inbox_release_idx ON delivery_inbox (release_at, enqueued_at) WHERE parked_at IS NULL;
