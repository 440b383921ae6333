-- plunder schema version 9: notifications only while someone listens. PostgreSQL
-- serializes the commits of notifying transactions (each holds a database-wide lock from
-- its commit until its WAL is flushed), so every worker's turn that named its completed jobs
-- waited for the other workers' flushes, whether or not anyone waited for a result. Each
-- listening connection now names its channels here before it LISTENs, refreshes its row
-- while it lives and removes it when it stops; a statement that would notify on a channel
-- first checks for a live row naming it. By the database clock, like every expiry.
CREATE TABLE plunder_listeners (
    id TEXT PRIMARY KEY,
    channels TEXT[] NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
