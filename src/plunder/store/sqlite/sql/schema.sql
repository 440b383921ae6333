-- plunder schema, fresh (SQLite): what all migrations applied in order produce.
-- Times are REAL seconds since the Unix epoch, taken
-- from one clock read per transaction (julianday('now'), millisecond precision).
-- JSON values (args, results, errors, lists) are stored as JSON text.

CREATE TABLE plunder_jobs (
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
-- A limit key's jobs that run, are admitted or are held (migration 14): admission counts
-- the first and walks the last in the order they are due.
CREATE INDEX plunder_jobs_limited ON plunder_jobs (limit_key, run_at, id)
    WHERE limit_key IS NOT NULL AND status IN ('pending', 'running');

CREATE TABLE plunder_runs (
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
    expires_at REAL NOT NULL,
    -- the tasks it runs, and its free slots as of its last heartbeat (migration 11)
    tasks TEXT NOT NULL DEFAULT '[]',
    free_slots INTEGER NOT NULL DEFAULT 0,
    -- the API key that opened it through the gateway (migration 13); NULL: direct
    key_id TEXT,
    -- its worker's labels (key=value), and until when its free_slots count (migration 22)
    labels TEXT NOT NULL DEFAULT '[]',
    free_until REAL
);
CREATE INDEX plunder_sessions_expiry ON plunder_sessions (expires_at);
CREATE INDEX plunder_sessions_key ON plunder_sessions (key_id) WHERE key_id IS NOT NULL;

CREATE TABLE plunder_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    term INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);

-- Each task's options as the last worker serving it published them when its session opened:
-- what an enqueue by name takes in a process without the task's code (migration 11).
-- `options` is a JSON object of the task's enqueue options but its queue.
CREATE TABLE plunder_tasks (
    name TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    pool TEXT NOT NULL,
    options TEXT NOT NULL,
    session_id TEXT NOT NULL,
    published_at REAL NOT NULL
);

-- API keys for the gateway (migration 13): a role, a group, the only queues it may use
-- (none: every queue), and the SHA-256 of its secret, never the secret.
CREATE TABLE plunder_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL DEFAULT '',
    role TEXT NOT NULL CHECK (role IN ('worker', 'producer', 'reader', 'admin')),
    key_group TEXT NOT NULL DEFAULT 'default',
    queues TEXT NOT NULL DEFAULT '[]',
    secret_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);

-- A queue of a group other than "default" is that group's alone (migration 13): only its
-- keys claim, enqueue and read there. Every other queue is the default group's.
CREATE TABLE plunder_queue_groups (
    queue TEXT PRIMARY KEY,
    group_name TEXT NOT NULL
);

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
-- Partitioned queues (migration 15): a job of partition p of queue q is in queue "q~p"; the
-- janitor assigns each partition to one live session of q, the generation growing at
-- every change of the queue's assignment.
CREATE TABLE plunder_partitions (
    queue TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL CHECK (partitions >= 1 AND partitions <= 1024),
    generation INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE plunder_partition_owners (
    queue TEXT NOT NULL,
    partition INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    PRIMARY KEY (queue, partition)
);
CREATE INDEX plunder_partition_owners_session ON plunder_partition_owners (session_id);
-- Fair queues (migration 21; docs/decisions/0012-fair-queues.md): a job's group (a
-- tenant) in group_name; a fair queue's claims take its groups in turn, by virtual time,
-- reading each group's due jobs on plunder_jobs_fair (only jobs with a group are in it),
-- in claim order (priority first: migration 23).
ALTER TABLE plunder_jobs ADD COLUMN group_name TEXT;
CREATE INDEX plunder_jobs_fair ON plunder_jobs (queue, group_name, priority DESC, run_at, id)
    WHERE status = 'pending' AND group_name IS NOT NULL;
-- A fair queue and the weight of each group named (1 for the others).
CREATE TABLE plunder_fair_queues (
    queue TEXT PRIMARY KEY,
    weights TEXT NOT NULL DEFAULT '{}'
);
-- The groups of a fair queue that have (or recently had) pending jobs, each with its
-- virtual time: a claim serves the lowest first and moves it on by jobs taken / weight.
CREATE TABLE plunder_fair_groups (
    queue TEXT NOT NULL,
    group_name TEXT NOT NULL,
    vtime REAL NOT NULL,
    PRIMARY KEY (queue, group_name)
);
CREATE INDEX plunder_fair_groups_turn ON plunder_fair_groups (queue, vtime, group_name);
-- Schedules (migration 18; docs/guide/periodic.md): next_at is the next tick not enqueued yet.
CREATE TABLE plunder_schedules (
    name TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    queue TEXT,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '[]',
    kwargs TEXT NOT NULL DEFAULT '{}',
    catch_up TEXT NOT NULL CHECK (catch_up = 'all' OR catch_up = 'latest' OR catch_up = 'none'),
    paused INTEGER NOT NULL DEFAULT 0 CHECK (paused = 0 OR paused = 1),
    next_at REAL,
    last_at REAL,
    last_job_id INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX plunder_schedules_due ON plunder_schedules (next_at) WHERE paused = 0;
-- Paused queues (migration 17): a claim takes no job of a queue listed here, nor of its
-- partitions; stores read the table at most once a second (plunder.store.pauses).
CREATE TABLE plunder_queue_pauses (
    queue TEXT PRIMARY KEY,
    paused_at REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);

-- Ordered keys (migration 20): see plunder.store.ordering.
CREATE TABLE plunder_ordered (
    key TEXT PRIMARY KEY,
    on_failure TEXT NOT NULL CHECK (on_failure IN ('continue', 'stop')),
    released_through INTEGER NOT NULL DEFAULT 0
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

-- The trace context a job was enqueued under, where its producer traced with OpenTelemetry
-- (migration 16; plunder.tracing).
CREATE TABLE plunder_traces (
    job_id INTEGER PRIMARY KEY REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    context TEXT NOT NULL
);

-- The labels a job prefers (affinity) and requires (require), as '{k=v,...}', and the
-- slots of its worker it takes (migration 22; docs/guide/affinity.md).
ALTER TABLE plunder_jobs ADD COLUMN affinity TEXT;
ALTER TABLE plunder_jobs ADD COLUMN require TEXT;
ALTER TABLE plunder_jobs ADD COLUMN cost INTEGER NOT NULL DEFAULT 1 CHECK (cost >= 1);

-- The slots of its worker a session has in all (its -c): a claim skips the jobs costing
-- more (migration 23; docs/decisions/0019).
ALTER TABLE plunder_sessions ADD COLUMN slots INTEGER NOT NULL DEFAULT 1000 CHECK (slots >= 1);
