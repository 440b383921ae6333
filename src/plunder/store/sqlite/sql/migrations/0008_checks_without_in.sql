-- plunder schema version 8: writes check the job's status and the run's outcome without
-- building a set for every row. SQLite evaluates `x IN ('a', 'b', ...)` in a CHECK by
-- building the list's set afresh for every row it writes, which cost about 2.4 µs per job
-- write (an enqueue, a claim, a completion: three per job) and 5.7 µs per history row; the
-- same rule spelled out with OR costs a comparison or two. SQLite cannot alter a CHECK, so
-- both tables are rebuilt: created anew, filled with every row as it is (ids included),
-- the old table dropped, the new one renamed, the indexes made again. SQLite numbers jobs
-- from sqlite_sequence, which forgets a dropped table's last id: the new table takes it
-- over, so an id is still never used twice after pruning. The store runs its migrations
-- with foreign-key enforcement off (see SqliteStore.migrate): dropping the old jobs table
-- with enforcement on would first delete every run and event of its jobs (ON DELETE
-- CASCADE). Every id is kept, so every reference still holds.
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
               OR status = 'failed' OR status = 'timed_out' OR status = 'cancelled'),
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 1 CHECK (max_attempts >= 1),
    timeout REAL CHECK (timeout IS NULL OR timeout > 0),
    backoff_base REAL NOT NULL DEFAULT 1.0,
    backoff_cap REAL NOT NULL DEFAULT 300.0,
    retry_on_timeout INTEGER NOT NULL DEFAULT 1,
    key TEXT,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    deadline_at REAL,
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
-- An idempotency key names at most one active job.
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');

CREATE TABLE plunder_runs_new (
    job_id INTEGER NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT CHECK (outcome IS NULL OR outcome = 'succeeded' OR outcome = 'failed'
                        OR outcome = 'timed_out' OR outcome = 'lost' OR outcome = 'cancelled'
                        OR outcome = 'stale' OR outcome = 'released'),
    error TEXT,
    logs TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (job_id, attempt)
);
INSERT INTO plunder_runs_new (
    job_id, attempt, session_id, worker, host, pid, started_at, finished_at, outcome,
    error, logs)
SELECT job_id, attempt, session_id, worker, host, pid, started_at, finished_at, outcome,
    error, logs
FROM plunder_runs;
DROP TABLE plunder_runs;
ALTER TABLE plunder_runs_new RENAME TO plunder_runs;
