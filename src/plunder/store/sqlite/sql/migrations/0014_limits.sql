-- plunder schema version 14: concurrency and rate limits by key (docs/guide/limits.md).
-- A job of a limit key is enqueued held: pending, its run_at pushed HOLD (200,000,000,000
-- seconds) past its due time, beyond any claim's reach; admission (plunder.store.limits),
-- under the key's row lock, counts the key's jobs running or admitted and brings up to the
-- rest of the ceiling back to their due time. Held: run_at from year 4000 on.
ALTER TABLE plunder_jobs ADD COLUMN limit_key TEXT;
CREATE INDEX plunder_jobs_limited ON plunder_jobs (limit_key, run_at, id)
    WHERE limit_key IS NOT NULL AND status IN ('pending', 'running');
-- A limit: at most `ceiling` jobs running or admitted (NULL: no ceiling), at most
-- `rate_count` admitted per `rate_period` seconds (a bucket of `tokens`, refilled at that
-- rate up to rate_count), none admitted before `paused_until`.
CREATE TABLE plunder_limits (
    key TEXT PRIMARY KEY,
    ceiling INTEGER CHECK (ceiling IS NULL OR ceiling >= 1),
    rate_count INTEGER CHECK (rate_count IS NULL OR rate_count >= 1),
    rate_period REAL CHECK (rate_period IS NULL OR rate_period > 0),
    tokens REAL NOT NULL DEFAULT 0,
    refilled_at REAL NOT NULL,
    paused_until REAL
);
