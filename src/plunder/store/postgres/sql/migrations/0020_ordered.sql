-- plunder schema version 20: ordered keys (docs/guide/partitions.md, decision 0013). An
-- ordered key is a limit of one whose held jobs are admitted only from its head (its
-- pending job first enqueued, once due). `on_failure` says what a job of the key that
-- ends failed does: 'continue' with the next, or 'stop' the key until it is released
-- (`released_through`: the last failed job a person let pass).
CREATE TABLE plunder_ordered (
    key TEXT PRIMARY KEY,
    on_failure TEXT NOT NULL CHECK (on_failure IN ('continue', 'stop')),
    released_through BIGINT NOT NULL DEFAULT 0
);
-- Queues whose jobs are ordered by their partition key, as declared.
CREATE TABLE plunder_ordered_queues (
    queue TEXT PRIMARY KEY,
    on_failure TEXT NOT NULL CHECK (on_failure IN ('continue', 'stop'))
);
-- A key's pending jobs in enqueue order (its head), and its jobs that ended failed.
CREATE INDEX plunder_jobs_ordered ON plunder_jobs (limit_key, id)
    WHERE limit_key IS NOT NULL AND status = 'pending';
CREATE INDEX plunder_jobs_limit_failed ON plunder_jobs (limit_key, id)
    WHERE limit_key IS NOT NULL AND status IN ('failed', 'timed_out', 'expired');
