-- plunder schema version 1 (SQLite). Times are REAL seconds since the Unix epoch, taken
-- from one clock read per transaction (julianday('now'), millisecond precision).
-- JSON values (args, results, errors, lists) are stored as JSON text.

CREATE TABLE plunder_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: ids are never reused after pruning
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '[]',
    kwargs TEXT NOT NULL DEFAULT '{}',
    priority INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled')),
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
    failed_sessions TEXT NOT NULL DEFAULT '[]'
);

-- Claim scans in claim order and filters queue and task, so it stops after LIMIT matches.
CREATE INDEX plunder_jobs_claim ON plunder_jobs (priority DESC, run_at, id)
    WHERE status = 'pending';
CREATE INDEX plunder_jobs_running ON plunder_jobs (session_id) WHERE status = 'running';
CREATE INDEX plunder_jobs_deadline ON plunder_jobs (deadline_at) WHERE status = 'running';
CREATE INDEX plunder_jobs_finished ON plunder_jobs (finished_at)
    WHERE status IN ('succeeded', 'failed', 'timed_out', 'cancelled');
CREATE INDEX plunder_jobs_listing ON plunder_jobs (queue, status, id);
-- An idempotency key names at most one active job.
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE status IN ('pending', 'running');

CREATE TABLE plunder_runs (
    job_id INTEGER NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT CHECK (outcome IS NULL OR outcome IN
        ('succeeded', 'failed', 'timed_out', 'lost', 'cancelled', 'stale', 'released')),
    error TEXT,
    logs TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE plunder_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('chunk', 'progress')),
    data TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX plunder_events_job ON plunder_events (job_id, id);

CREATE TABLE plunder_sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    queues TEXT NOT NULL DEFAULT '[]',
    expiry REAL NOT NULL CHECK (expiry > 0),
    started_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX plunder_sessions_expiry ON plunder_sessions (expires_at);

CREATE TABLE plunder_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    term INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
