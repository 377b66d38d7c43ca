-- Switchboard schema, version 6: the doorbell rings each todo once across every API process.

-- Set by the one process that rings the todo (UPDATE … WHERE rung_at IS NULL RETURNING); NULL while no
-- session has been rung for it. Existing rows stay NULL: a catch-up only looks at the last minutes.
ALTER TABLE todos ADD COLUMN rung_at timestamptz;

-- A listener that reconnects looks for what it missed: pending, unrung todos of its sessions' endpoints.
CREATE INDEX todos_unrung_idx ON todos (endpoint_id, created_at) WHERE rung_at IS NULL AND state = 'pending';
