-- plunder schema version 12: a job's policy for a run lost with its worker
-- (retry_on_lost: retried, as before, or ended at once) and its start-by deadline
-- (expires_at: a pending job not started by then ends in the new terminal status
-- 'expired', and no claim takes it). SQLite cannot alter a CHECK, so the jobs table is
-- rebuilt as in migration 0008: created anew, filled with every row as it is (ids
-- included, the new columns at their defaults), the old table dropped, the new one
-- renamed, sqlite_sequence carried over and the indexes made again. The store runs its
-- migrations with foreign-key enforcement off, so the runs and events of the jobs stay.
CREATE TABLE plunder_jobs_new (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused after pruning
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '[]',
    kwargs TEXT NOT NULL DEFAULT '{}',
    priority INTEGER NOT NULL DEFAULT 0,
    -- a CHECK that names more than two values spells them out with OR: SQLite builds the
    -- set of such an IN list afresh for every row it checks, microseconds per write (0008)
    status TEXT NOT NULL DEFAULT 'pending'
        CHECK (status = 'pending' OR status = 'running' OR status = 'succeeded'
               OR status = 'failed' OR status = 'timed_out' OR status = 'cancelled'
               OR status = 'expired'),
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    timeout REAL CHECK (timeout IS NULL OR timeout > 0),
    backoff_base REAL NOT NULL DEFAULT 1.0,
    backoff_cap REAL NOT NULL DEFAULT 300.0,
    retry_on_timeout INTEGER NOT NULL DEFAULT 1,
    -- a run lost with its worker is retried (see job_lose_many; migration 0012)
    retry_on_lost INTEGER NOT NULL DEFAULT 1,
    key TEXT,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    deadline_at REAL,
    -- the start-by deadline of a job not started yet: a claim never takes it later
    expires_at REAL,
    session_id TEXT,
    result TEXT,
    error TEXT,
    failed_sessions TEXT NOT NULL DEFAULT '[]',
    -- deaths of its worker while it ran, since it last ran to an outcome (see job_claim_many)
    losses INTEGER NOT NULL DEFAULT 0 CHECK (losses >= 0),
    -- the run that succeeded, written by the completion (see migration 0006)
    run_worker TEXT,
    run_host TEXT,
    run_pid INTEGER,
    run_logs TEXT
);
INSERT INTO plunder_jobs_new (
    id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
    finished_at, deadline_at, session_id, result, error, failed_sessions, losses, run_worker,
    run_host, run_pid, run_logs)
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
    finished_at, deadline_at, session_id, result, error, failed_sessions, losses, run_worker,
    run_host, run_pid, run_logs
FROM plunder_jobs;
DELETE FROM sqlite_sequence WHERE name = 'plunder_jobs_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'plunder_jobs_new', seq FROM sqlite_sequence WHERE name = 'plunder_jobs';
DROP TABLE plunder_jobs;
ALTER TABLE plunder_jobs_new RENAME TO plunder_jobs;
-- Claims walk one queue's pending jobs in claim order, one priority level at a time, and
-- stop after LIMIT matches or at the first job due later.
CREATE INDEX plunder_jobs_claim ON plunder_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
CREATE INDEX plunder_jobs_pending_run_at ON plunder_jobs (run_at) WHERE status = 'pending';
CREATE INDEX plunder_jobs_running ON plunder_jobs (session_id) WHERE status = 'running';
-- The janitor's walk of the pending jobs past their start-by deadline (job_expire_many).
CREATE INDEX plunder_jobs_expires ON plunder_jobs (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
-- An idempotency key names at most one active job.
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');
