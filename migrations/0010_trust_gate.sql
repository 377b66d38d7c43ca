-- Switchboard schema, version 10: the trust gate, quarantined deliveries and their release, forced rule saves.

-- A webhook's trust gate (routing/trust.py): {"allow_all": true} | {"logins": [...], "match": ...} |
-- {"actor_ids": [...]}; NULL means no gate. Set by create_webhook and set_webhook_trusted_actors (its owner only).
-- A stored value the gate cannot read trusts no one.
ALTER TABLE endpoint_webhooks ADD COLUMN trusted_actors jsonb
    CHECK (trusted_actors IS NULL OR jsonb_typeof(trusted_actors) = 'object');

-- The latest rule save that went through with force: true over rules that fault on recent events
-- ({at, by, faults}); NULL once a save found none.
ALTER TABLE endpoint_webhooks ADD COLUMN routing_forced jsonb;

-- A fifth disposition: held for a person (the trust gate, or a {"quarantine": true} action).
ALTER TABLE events DROP CONSTRAINT events_disposition_check;
ALTER TABLE events ADD CONSTRAINT events_disposition_check
    CHECK (disposition IN ('routed', 'dropped', 'repeat', 'faulted', 'quarantined'));

-- A quarantined event's review: held until a person releases it (release_webhook_event, which routes it again as
-- a new event, release_event_id) or dismisses it (dismiss_webhook_event). reviewed_by is "endpoint:<id>".
ALTER TABLE events ADD COLUMN quarantine_state text
    CHECK (quarantine_state IN ('held', 'released', 'dismissed'));
ALTER TABLE events ADD CONSTRAINT events_quarantine_state_check_disposition
    CHECK ((disposition = 'quarantined') = (quarantine_state IS NOT NULL));
ALTER TABLE events ADD COLUMN reviewed_by text;
ALTER TABLE events ADD COLUMN reviewed_at timestamptz;
ALTER TABLE events ADD COLUMN review_note text;
ALTER TABLE events ADD COLUMN release_event_id text;
-- On the events a release routes (and on later re-routes of a released delivery): {by, at, event_id}, the release
-- that let it past the gate.
ALTER TABLE events ADD COLUMN release jsonb;
CREATE INDEX events_quarantine_held_idx ON events (webhook_id, received_at DESC) WHERE quarantine_state = 'held';
