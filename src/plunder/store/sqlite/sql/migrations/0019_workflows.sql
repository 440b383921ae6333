-- plunder schema version 19: workflows (plunder.flows, docs/guide/workflows.md). A job may
-- wait for others: an edge (parent, child) with the child's policy should the parent end
-- other than succeeded. A child waits ('waiting') with parents_left counting its parents
-- not ended; the trigger plunder_jobs_settle, fired only when a job with children
-- (has_children) ends, counts it down in the same transaction: at zero the child is
-- pending (claimable at once), and a parent's failure skips or fails it if its edge says
-- so ('skipped', a new terminal status). SQLite cannot alter a CHECK, so the jobs table is
-- rebuilt as in 0008 (ids and the id sequence kept; the store migrates with foreign-key
-- enforcement off, see SqliteStore.migrate).
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
               OR status = 'expired' OR status = 'waiting' OR status = 'skipped'),
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
    run_logs TEXT,
    -- its limit key (migration 14; docs/guide/limits.md)
    limit_key TEXT,
    -- workflows (migration 19): some job waits for this one; its parents not ended yet
    has_children INTEGER NOT NULL DEFAULT 0,
    parents_left INTEGER NOT NULL DEFAULT 0
);
INSERT INTO plunder_jobs_new (
    id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, retry_on_lost, key, run_at, created_at,
    started_at, finished_at, deadline_at, expires_at, session_id, result, error,
    failed_sessions, losses, run_worker, run_host, run_pid, run_logs, limit_key)
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, retry_on_lost, key, run_at, created_at,
    started_at, finished_at, deadline_at, expires_at, session_id, result, error,
    failed_sessions, losses, run_worker, run_host, run_pid, run_logs, limit_key
FROM plunder_jobs;
DELETE FROM sqlite_sequence WHERE name = 'plunder_jobs_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'plunder_jobs_new', seq FROM sqlite_sequence WHERE name = 'plunder_jobs';
DROP TABLE plunder_jobs;
ALTER TABLE plunder_jobs_new RENAME TO plunder_jobs;
CREATE INDEX plunder_jobs_claim ON plunder_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
CREATE INDEX plunder_jobs_pending_run_at ON plunder_jobs (run_at) WHERE status = 'pending';
CREATE INDEX plunder_jobs_running ON plunder_jobs (session_id) WHERE status = 'running';
CREATE INDEX plunder_jobs_expires ON plunder_jobs (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');
CREATE INDEX plunder_jobs_limited ON plunder_jobs (limit_key, run_at, id)
    WHERE limit_key IS NOT NULL AND status IN ('pending', 'running');
-- Workflows (migration 19): the child waits for the parent; on_failure is what becomes of
-- the child should the parent end other than succeeded: 'run' it anyway, 'skip' it (it
-- ends skipped) or 'fail' it (it ends failed).
CREATE TABLE plunder_edges (
    parent_id INTEGER NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    child_id INTEGER NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    on_failure TEXT NOT NULL CHECK (on_failure = 'run' OR on_failure = 'skip'
                                    OR on_failure = 'fail'),
    PRIMARY KEY (parent_id, child_id)
) WITHOUT ROWID;
CREATE INDEX plunder_edges_child ON plunder_edges (child_id, parent_id);
-- When a job with children ends, in its transaction: each waiting child counts one parent
-- fewer, is pending once none is left, or ends skipped / failed if this parent did not
-- succeed and its edge says so. A child that so ends settles its own children in turn (the
-- store turns recursive_triggers on). The WHEN clause keeps it off every other job.
CREATE TRIGGER plunder_jobs_settle AFTER UPDATE OF status ON plunder_jobs
FOR EACH ROW WHEN NEW.has_children AND OLD.status <> NEW.status
    AND (NEW.status = 'succeeded' OR NEW.status = 'failed' OR NEW.status = 'timed_out'
         OR NEW.status = 'cancelled' OR NEW.status = 'expired' OR NEW.status = 'skipped')
BEGIN
    UPDATE plunder_jobs
    SET parents_left = parents_left - 1,
        status = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure = 'skip' THEN 'skipped'
                      WHEN NEW.status <> 'succeeded' AND e.on_failure = 'fail' THEN 'failed'
                      WHEN parents_left <= 1 THEN 'pending' ELSE 'waiting' END,
        finished_at = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure <> 'run'
                           THEN COALESCE(NEW.finished_at,
                                         (julianday('now') - 2440587.5) * 86400.0)
                           ELSE finished_at END,
        error = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure <> 'run'
                     THEN json_object('type', 'plunder.ParentFailed', 'message',
                                      'parent job ' || NEW.id || ' ended ' || NEW.status,
                                      'traceback', '')
                     ELSE error END
    FROM plunder_edges AS e
    WHERE e.parent_id = NEW.id AND plunder_jobs.id = e.child_id
      AND plunder_jobs.status = 'waiting';
END;
