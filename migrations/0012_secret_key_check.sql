-- The fingerprint of the SWITCHBOARD_SECRET_KEY that seals this database's secrets (store/crypto.py): the first api
-- or worker process records it, and every later one compares its own key's and refuses to start on another key,
-- instead of starting and answering 503 to every signed delivery whose secret no longer decrypts.
CREATE TABLE secret_key_check (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key_id text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
