-- plunder schema version 13: API keys for the gateway (plunder serve). A key has a role, a
-- group (the queues a group owns are its alone) and, optionally, the only queues it may
-- use; only the SHA-256 of its secret is kept. A session opened through the gateway names the key that opened it: only that key
-- may speak for it, and revoking the key ends it.
CREATE TABLE plunder_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL DEFAULT '',
    role TEXT NOT NULL CHECK (role IN ('worker', 'producer', 'reader', 'admin')),
    key_group TEXT NOT NULL DEFAULT 'default',
    queues TEXT[] NOT NULL DEFAULT '{}',
    secret_hash TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    revoked_at TIMESTAMPTZ
);
ALTER TABLE plunder_sessions ADD COLUMN key_id TEXT;
CREATE INDEX plunder_sessions_key ON plunder_sessions (key_id) WHERE key_id IS NOT NULL;

-- A queue of a group other than "default" is that group's alone (migration 13): only its
-- keys claim, enqueue and read there. Every other queue is the default group's.
CREATE TABLE plunder_queue_groups (
    queue TEXT PRIMARY KEY,
    group_name TEXT NOT NULL
);
