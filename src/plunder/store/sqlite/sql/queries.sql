-- plunder's runtime SQL for SQLite. An operation PostgreSQL has too carries the same name in
-- ../postgres/queries.sql, with the same parameters and the same result columns; the names
-- only this dialect has are declared in plunder.store.queries.DIALECT_ONLY.
--
-- :now is always a number here: the store reads the clock once per transaction (clock_now)
-- and passes it to every statement, so one transaction sees one instant.
-- List parameters arrive as JSON text and are opened with json_each().
-- Batch queries (marked "batch") are executed once per row inside one transaction; a batch
-- query may be several statements (each ending with ";" at the end of a line), run in turn.

-- name: clock_now
SELECT (julianday('now') - 2440587.5) * 86400.0 AS now;

-- name: write_lock
-- A write that changes nothing: in a deferred transaction (a caller's own, see
-- Engine.run_joined) it takes the write lock now, waiting out the busy timeout for
-- it, as BEGIN IMMEDIATE would have.
UPDATE plunder_schema SET version = version WHERE 0;

-- name: schema_table_exists
SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = 'plunder_schema';

-- name: schema_table_create
CREATE TABLE IF NOT EXISTS plunder_schema (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);

-- name: schema_row_init
INSERT INTO plunder_schema (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING;

-- name: schema_version_get
SELECT version FROM plunder_schema WHERE id = 1;

-- name: schema_version_lock
-- BEGIN IMMEDIATE already holds the write lock; nothing more to take.
SELECT version FROM plunder_schema WHERE id = 1;

-- name: schema_version_set
UPDATE plunder_schema SET version = :version WHERE id = 1;

-- name: job_insert
-- batch. The jobs of one batch share their options (queue, task, priority, …), bound once;
-- each row brings its args, kwargs and key, and its id (:seq): SQLite's writers take turns
-- (BEGIN IMMEDIATE), so the store numbers a batch itself, from job_id_next, in input order,
-- and reads nothing back. A key that names an active job (or an earlier row of the batch:
-- rows insert in input order) inserts nothing and leaves its id unused; the store then finds
-- which ids are missing and reads the job holding each of their keys. (WHERE true: SQLite's
-- parser needs a WHERE before ON CONFLICT in an INSERT … SELECT.)
INSERT INTO plunder_jobs (
    id, queue, task, args, kwargs, priority, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at,
    retry_on_lost, expires_at, limit_key, group_name, affinity, require, cost
)
SELECT v.column1, :queue, :task, v.column2, v.column3, :priority, :max_attempts, :timeout,
       :backoff_base, :backoff_cap, :retry_on_timeout, v.column4,
       :now + :delay + (:limit IS NOT NULL) * 200000000000, :now,
       :retry_on_lost, :now + :expires_in, :limit, :group, :affinity, :require, :cost
FROM (VALUES (:seq, :args, :kwargs, :key)) AS v
WHERE true
ORDER BY v.column1
ON CONFLICT (key) WHERE key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING;

-- name: job_insert_mixed
-- batch. job_insert for jobs that do not share their options: each row brings its own.
INSERT INTO plunder_jobs (
    id, queue, task, args, kwargs, priority, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at,
    retry_on_lost, expires_at, limit_key, group_name, affinity, require, cost
)
SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, v.column8,
       v.column9, v.column10, v.column11, v.column12,
       :now + v.column13 + (v.column16 IS NOT NULL) * 200000000000, :now,
       v.column14, :now + v.column15, v.column16, v.column17, v.column18, v.column19,
       v.column20
FROM (VALUES (:seq, :queue, :task, :args, :kwargs, :priority, :max_attempts, :timeout,
              :backoff_base, :backoff_cap, :retry_on_timeout, :key, :delay,
              :retry_on_lost, :expires_in, :limit, :group, :affinity, :require, :cost)) AS v
WHERE true
ORDER BY v.column1
ON CONFLICT (key) WHERE key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING;

-- name: job_id_next
-- The id of the next job: one above AUTOINCREMENT's high-water mark (so no id is used twice,
-- even after pruning) and above every id in the table. Read inside the enqueue's write
-- transaction, which numbers its jobs from here (see job_insert).
SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'plunder_jobs'), 0),
           coalesce((SELECT max(id) FROM plunder_jobs), 0)) + 1 AS id;

-- name: job_get_active_by_keys
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE key IN (SELECT value FROM json_each(:keys)) AND status IN ('pending', 'running');

-- name: job_get
-- A job's own columns (every read of jobs): not the run kept on it (run_*, see job_runs).
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs WHERE id = :job_id;

-- name: job_claim_level
-- The best priority level below :below (+inf: the best of all) among one queue's pending
-- jobs: one probe of plunder_jobs_claim, which holds each queue's pending jobs in claim
-- order. A claim reads one level at a time (see job_claim_walk).
SELECT priority FROM plunder_jobs INDEXED BY plunder_jobs_claim
WHERE status = 'pending' AND queue = :queue AND priority < :below
ORDER BY priority DESC
LIMIT 1;

-- name: job_claim_walk
-- Up to :limit jobs of one queue and priority level that a claim may take now, in claim
-- order. Within a level the jobs due now come first in plunder_jobs_claim, and
-- `run_at <= :now` bounds the walk (an index range, not a filter): it stops at the first
-- job due later, so a claim never walks the delayed jobs behind the due ones. A job that
-- this session already failed is left to another live session that runs its queue and
-- task and has a free slot (as of its last heartbeat), while there is one; otherwise it is
-- taken at once. Suspects (jobs lost with their worker :suspect_losses times or more) are
-- read only when :take_suspect is true; the store takes at most one. A job past its
-- start-by deadline that the janitor has not ended yet is stepped over (a filter on the
-- row the walk reads anyway), so a burst of them cannot fill :limit and stall the queue.
SELECT j.id, j.losses, j.priority, j.run_at, j.cost FROM plunder_jobs AS j INDEXED BY plunder_jobs_claim
WHERE j.status = 'pending'
  AND j.queue = :queue
  AND j.priority = :priority
  AND j.run_at <= :now
  AND (j.expires_at IS NULL OR j.expires_at > :now)  -- not past its start-by deadline
  AND j.task IN (SELECT value FROM json_each(:tasks))
  AND (j.losses < :suspect_losses OR :take_suspect)
  AND NOT (
      j.failed_sessions != '[]'
      AND EXISTS (SELECT 1 FROM json_each(j.failed_sessions) AS f WHERE f.value = :session_id)
      AND EXISTS (
          SELECT 1 FROM plunder_sessions AS s
          WHERE s.expires_at > :now AND s.free_slots > 0
            AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = j.queue)
            AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = j.task)
            AND s.id NOT IN (SELECT f.value FROM json_each(j.failed_sessions) AS f)))
  -- preferred labels: held here, or by no labelled session of the queue with its cost in
  -- free slots reported lately (migrations 22, 23); required labels: held here
  AND (j.affinity IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.affinity, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id))))
    OR NOT EXISTS (
      SELECT 1 FROM plunder_sessions AS s
      WHERE s.free_until > :now AND s.free_slots >= j.cost AND s.labels != '[]'
        AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = j.queue)
        AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = j.task)
        AND NOT EXISTS (
          SELECT 1 FROM json_each('["' || replace(replace(trim(
              j.affinity || coalesce(j.require, ''), '{}'), '}{', ','), ',', '","') || '"]') AS a
          WHERE a.value NOT IN (SELECT value FROM json_each(s.labels)))))
  AND (j.require IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.require, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id)))))
  -- no more slots than this worker has in all: left to a bigger one (migration 23)
  AND (j.cost = 1 OR j.cost <= (SELECT slots FROM plunder_sessions WHERE id = :session_id))
ORDER BY j.run_at, j.id
LIMIT :limit;

-- name: job_claim_rest
-- Up to :limit jobs of one queue below priority level :below that a claim may take now, in
-- claim order: after CLAIM_LEVELS levels (see SqliteDriver.claim_rows), the rest of a
-- queue with many levels (a priority used as a score) is walked in one go, the jobs due
-- later included, rather than with a probe per level. Filters as job_claim_walk.
SELECT j.id, j.losses, j.priority, j.run_at, j.cost FROM plunder_jobs AS j INDEXED BY plunder_jobs_claim
WHERE j.status = 'pending'
  AND j.queue = :queue
  AND j.priority < :below
  AND j.run_at <= :now
  AND (j.expires_at IS NULL OR j.expires_at > :now)  -- not past its start-by deadline
  AND j.task IN (SELECT value FROM json_each(:tasks))
  AND (j.losses < :suspect_losses OR :take_suspect)
  AND NOT (
      j.failed_sessions != '[]'
      AND EXISTS (SELECT 1 FROM json_each(j.failed_sessions) AS f WHERE f.value = :session_id)
      AND EXISTS (
          SELECT 1 FROM plunder_sessions AS s
          WHERE s.expires_at > :now AND s.free_slots > 0
            AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = j.queue)
            AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = j.task)
            AND s.id NOT IN (SELECT f.value FROM json_each(j.failed_sessions) AS f)))
  -- preferred labels: held here, or by no labelled session of the queue with its cost in
  -- free slots reported lately (migrations 22, 23); required labels: held here
  AND (j.affinity IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.affinity, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id))))
    OR NOT EXISTS (
      SELECT 1 FROM plunder_sessions AS s
      WHERE s.free_until > :now AND s.free_slots >= j.cost AND s.labels != '[]'
        AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = j.queue)
        AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = j.task)
        AND NOT EXISTS (
          SELECT 1 FROM json_each('["' || replace(replace(trim(
              j.affinity || coalesce(j.require, ''), '{}'), '}{', ','), ',', '","') || '"]') AS a
          WHERE a.value NOT IN (SELECT value FROM json_each(s.labels)))))
  AND (j.require IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.require, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id)))))
  -- no more slots than this worker has in all: left to a bigger one (migration 23)
  AND (j.cost = 1 OR j.cost <= (SELECT slots FROM plunder_sessions WHERE id = :session_id))
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT :limit;

-- name: job_claim_many
-- Claim the pending jobs :ids (chosen by job_claim_walk in this transaction, under the
-- write lock) for a live session; never one past its start-by deadline, even one the
-- janitor has not ended yet.
UPDATE plunder_jobs
SET status = 'running',
    attempt = attempt + 1,
    session_id = :session_id,
    started_at = :now,
    finished_at = NULL,
    deadline_at = :now + timeout,
    -- who runs this attempt: its history row names them even if the session is gone
    (run_worker, run_host, run_pid) =
        (SELECT name, host, pid FROM plunder_sessions WHERE id = :session_id)
WHERE id IN (SELECT value FROM json_each(:ids))
  AND +status = 'pending'
  AND (expires_at IS NULL OR expires_at > :now)  -- the start-by deadline
  AND EXISTS (SELECT 1 FROM plunder_sessions WHERE id = :session_id AND expires_at > :now)
-- the job's own columns, not the run kept on it once it succeeds (run_*)
RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
          backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
          finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
          retry_on_lost, expires_at, limit_key, affinity, require, cost;

-- name: session_free
-- A labelled session's free slots after its claim (the slots it asked to fill, less the
-- costs of what it took), counted by others' claims for 2 s (see migration 22); run in the claim's
-- transaction. The same count, still counted for over half that time, is not written again:
-- every commit here wakes every worker of the file, and idle labelled workers would wake
-- each other without end, each claim's report waking the others to claim and report.
UPDATE plunder_sessions SET free_slots = max(:free_slots, 0), free_until = :now + min(expiry, 2.0)
WHERE id = :session_id AND labels != '[]' AND expires_at > :now
  AND (free_slots IS NOT max(:free_slots, 0) OR free_until IS NULL
       OR free_until < :now + min(expiry, 2.0) / 2);

-- name: run_close
-- batch. The history row of an attempt that ended other than in success, written once, as
-- it ends, after the statement that ended it, in the same transaction: its worker and start
-- from the job, where the claim wrote them (from the session, for an attempt an earlier
-- plunder claimed). A row that is already there keeps its first outcome; one an earlier
-- plunder opened is closed here.
INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, started_at,
                          finished_at, outcome, error, logs)
SELECT b.column1, b.column2, b.column3, coalesce(j.run_worker, s.name, ''),
       coalesce(j.run_host, s.host, ''), coalesce(j.run_pid, s.pid, 0),
       coalesce(j.started_at, :now), :now, b.column4, b.column5, b.column6
FROM (VALUES (:job_id, :attempt, :session_id, :outcome, :error, :logs)) AS b
JOIN plunder_jobs AS j ON j.id = b.column1 AND +j.attempt = b.column2
LEFT JOIN plunder_sessions AS s ON s.id = b.column3
WHERE b.column3 IS NOT NULL
ON CONFLICT (job_id, attempt) DO UPDATE
SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error,
    logs = excluded.logs
WHERE plunder_runs.outcome IS NULL;

-- name: run_mark_stale
-- batch. A completion or failure refused by the fence is recorded as a stale run, if the
-- attempt still runs under that session (its session expired and the reaper has not been
-- yet). Any other refused attempt has its row already (lost, timed out, cancelled), or
-- succeeded (the task's own transaction acknowledged it: its run is on the job), or was
-- never this session's. The unary + keeps the lookup on the ids of the batch.
INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, started_at,
                          finished_at, outcome, logs)
SELECT j.id, j.attempt, j.session_id, coalesce(j.run_worker, s.name, ''),
       coalesce(j.run_host, s.host, ''), coalesce(j.run_pid, s.pid, 0), j.started_at, :now,
       'stale', b.column4
FROM (VALUES (:job_id, :attempt, :session_id, :logs)) AS b
JOIN plunder_jobs AS j
  ON j.id = b.column1 AND +j.attempt = b.column2 AND +j.session_id = b.column3
     AND +j.status = 'running'
LEFT JOIN plunder_sessions AS s ON s.id = b.column3
WHERE j.started_at IS NOT NULL
ON CONFLICT (job_id, attempt) DO UPDATE
SET finished_at = excluded.finished_at, outcome = 'stale', logs = excluded.logs
WHERE plunder_runs.outcome IS NULL AND plunder_runs.session_id = excluded.session_id;

-- name: session_alive
SELECT id FROM plunder_sessions WHERE id = :session_id AND expires_at > :now;

-- name: job_complete
-- batch, set-based: the store repeats the one-row VALUES list once per row of the batch
-- (columnN is its Nth value) and runs the statement once over them all; it counts the rows
-- it changed. Fenced: only the current claim of a running job, under a live session. The
-- run that succeeded is kept on the job (its worker, written by the claim, and its logs;
-- see migration 0006): no history row is written. The unary + keeps the planner on the
-- ids of the batch (rowid lookups) instead of walking the session's running jobs for each
-- row.
UPDATE plunder_jobs
SET status = 'succeeded', result = b.column4, finished_at = :now, deadline_at = NULL,
    run_logs = b.column5
FROM (VALUES (:job_id, :attempt, :claim_session, :result, :logs)) AS b
WHERE plunder_jobs.id = b.column1 AND +plunder_jobs.attempt = b.column2
  AND +plunder_jobs.session_id = b.column3 AND +plunder_jobs.status = 'running'
  AND EXISTS (SELECT 1 FROM plunder_sessions AS s WHERE s.id = b.column3 AND s.expires_at > :now);

-- name: job_fail
-- batch. Fenced like job_complete. Retried (back to pending after :delay seconds) when
-- :retry is true and attempts remain; otherwise the job ends in :final_status.
UPDATE plunder_jobs
SET status = CASE WHEN :retry AND attempt < max_attempts THEN 'pending' ELSE :final_status END,
    -- a limited job goes back held (see limit_admit)
    run_at = CASE WHEN :retry AND attempt < max_attempts
                  THEN :now + :delay + (limit_key IS NOT NULL) * 200000000000 ELSE run_at END,
    finished_at = CASE WHEN :retry AND attempt < max_attempts THEN NULL ELSE :now END,
    session_id = CASE WHEN :retry AND attempt < max_attempts THEN NULL ELSE session_id END,
    error = :error,
    deadline_at = NULL,
    failed_sessions = json_insert(failed_sessions, '$[#]', :session_id),
    losses = 0  -- it ran to an outcome and its worker lived: not a suspect
WHERE id = :job_id AND attempt = :attempt AND session_id = :session_id
  AND status = 'running'
  AND EXISTS (SELECT 1 FROM plunder_sessions WHERE id = :session_id AND expires_at > :now)
RETURNING id, attempt, :session_id AS session_id, status, queue;

-- name: job_release
-- batch. Graceful shutdown gives a running job back: pending at once, and the attempt it
-- used is not counted against max_attempts. started_at stays, as after a failed attempt:
-- the released run's history row reads it (run_close).
UPDATE plunder_jobs
SET status = 'pending', session_id = NULL, deadline_at = NULL,
    max_attempts = max_attempts + 1,
    -- a limited job goes back held (see limit_admit)
    run_at = :now + (limit_key IS NOT NULL) * 200000000000
WHERE id = :job_id AND attempt = :attempt AND session_id = :session_id
  AND status = 'running'
RETURNING id, attempt, :session_id AS session_id, status, queue;

-- name: job_abandon
-- batch. Graceful shutdown past the grace period stopped this attempt's task, which had
-- started (a thread may even run on): a job whose retry_on_lost is off ends timed_out with
-- :error (plunder.WorkerLost) and is not run again, as job_lose_many ends it when its
-- worker is lost; the store releases the others (job_release). Fenced by the claim.
UPDATE plunder_jobs
SET status = 'timed_out', finished_at = :now, error = :error, deadline_at = NULL,
    failed_sessions = json_insert(failed_sessions, '$[#]', :session_id),
    losses = losses + 1
WHERE id = :job_id AND attempt = :attempt AND session_id = :session_id
  AND status = 'running' AND NOT retry_on_lost
RETURNING id, attempt, :session_id AS session_id, status, queue;

-- name: job_claim_state
SELECT id, attempt, session_id, status FROM plunder_jobs
WHERE id IN (SELECT value FROM json_each(:job_ids));

-- name: session_running
-- What the database says this session runs: the heartbeat compares it with what the worker
-- says it runs, to find claims whose answer never reached the worker.
SELECT id, attempt, session_id FROM plunder_jobs
WHERE session_id = :session_id AND status = 'running';

-- name: job_check_claim
-- The fence for writes that are not state changes (stream events).
SELECT j.id FROM plunder_jobs AS j
WHERE j.id = :job_id AND j.attempt = :attempt AND j.session_id = :session_id
  AND j.status = 'running'
  AND EXISTS (SELECT 1 FROM plunder_sessions WHERE id = :session_id AND expires_at > :now);

-- name: job_cancel
UPDATE plunder_jobs
SET status = 'cancelled', finished_at = :now, deadline_at = NULL
WHERE id = :job_id AND status IN ('pending', 'running', 'waiting')
RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
          backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
          finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
          retry_on_lost, expires_at, limit_key, affinity, require, cost;

-- name: job_retry
-- By a person or the API: one more attempt for a job that ended without success. Without
-- a start-by deadline: an expired job retried runs whenever a worker takes it.
UPDATE plunder_jobs
SET status = 'pending', finished_at = NULL, started_at = NULL,
    run_at = :now + (limit_key IS NOT NULL) * 200000000000,  -- held (see limit_admit)
    session_id = NULL, result = NULL, error = NULL, expires_at = NULL,
    max_attempts = max(max_attempts, attempt + 1)
WHERE id = :job_id AND status IN ('failed', 'timed_out', 'cancelled', 'expired')
RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
          backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
          finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
          retry_on_lost, expires_at, limit_key, affinity, require, cost;

-- name: job_list
-- Newest first, keyset-paginated by id (:after is the last id of the previous page).
-- A partitioned queue's jobs are in its partitions' queues ("q~3", migration 14) too.
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE (:queue IS NULL OR queue = :queue
       OR substr(queue, 1, length(:queue) + 1) = :queue || '~')
  AND (:status IS NULL OR status = :status)
  AND (:task IS NULL OR task = :task)
  AND (:after IS NULL OR id < :after)
ORDER BY id DESC
LIMIT :limit;

-- name: job_runs
-- The history rows of the runs that ended other than in success, and the job's current
-- attempt when it runs or succeeded (migration 0006): that run is on the job, its worker
-- from the job (written by the claim; from its session, for an attempt an earlier plunder
-- claimed). A row an earlier plunder opened for that attempt (outcome still NULL) is the
-- same run: the job's record of it wins.
SELECT job_id, attempt, session_id, worker, host, pid, started_at, finished_at, outcome,
       error, logs
FROM plunder_runs AS r
WHERE r.job_id = :job_id
  AND (r.outcome IS NOT NULL OR NOT EXISTS (
      SELECT 1 FROM plunder_jobs AS j
      WHERE j.id = r.job_id AND j.attempt = r.attempt AND j.status IN ('running', 'succeeded')))
UNION ALL
SELECT j.id, j.attempt, j.session_id, coalesce(j.run_worker, s.name, ''),
       coalesce(j.run_host, s.host, ''), coalesce(j.run_pid, s.pid, 0), j.started_at,
       CASE WHEN j.status = 'succeeded' THEN j.finished_at END,
       CASE WHEN j.status = 'succeeded' THEN 'succeeded' END,
       NULL, coalesce(j.run_logs, '[]')
FROM plunder_jobs AS j
LEFT JOIN plunder_sessions AS s ON s.id = j.session_id
WHERE j.id = :job_id AND j.status IN ('running', 'succeeded') AND j.started_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM plunder_runs AS r
                  WHERE r.job_id = j.id AND r.attempt = j.attempt AND r.outcome IS NOT NULL)
ORDER BY attempt;

-- name: event_append
-- batch. Called after job_check_claim in the same transaction.
INSERT INTO plunder_events (job_id, attempt, kind, data, created_at)
VALUES (:job_id, :attempt, :kind, :data, :now)
RETURNING id;

-- name: event_list
SELECT * FROM plunder_events
WHERE job_id = :job_id AND id > :after
ORDER BY id
LIMIT :limit;

-- name: session_insert
-- Its free slots count for claims for 2 s (or its expiry, if shorter): see session_heartbeat.
INSERT INTO plunder_sessions (id, name, host, pid, queues, expiry, started_at, heartbeat_at,
                              expires_at, tasks, free_slots, key_id, labels, free_until,
                              slots)
VALUES (:session_id, :name, :host, :pid, :queues, :expiry, :now, :now, :now + :expiry,
        :tasks, :free_slots, :key_id, :labels, :now + min(:expiry, 2.0), :slots)
RETURNING *;

-- name: session_heartbeat
-- A session past its expiry is dead even before the janitor reaps it: it cannot come back.
-- Its free slots as the worker counts them now (NULL: unchanged), which a claim counts
-- for 2 s (or its expiry, if shorter; see migration 22), and its labels (NULL: unchanged).
UPDATE plunder_sessions
SET heartbeat_at = :now, expires_at = :now + expiry,
    free_slots = coalesce(:free_slots, free_slots),
    free_until = CASE WHEN :free_slots IS NULL THEN free_until ELSE :now + min(expiry, 2.0) END,
    labels = coalesce(:labels, labels)
WHERE id = :session_id AND expires_at > :now
RETURNING *;

-- name: session_queues
-- A live session joins :add (after the queues it has, in order) and leaves :remove, in one
-- statement: set union and difference on the row as the write lock finds it, so two
-- changes at once both count.
UPDATE plunder_sessions
SET queues = (
    SELECT json_group_array(q) FROM (
        SELECT q FROM (
            SELECT value AS q, key AS n FROM json_each(plunder_sessions.queues)
            UNION ALL
            SELECT value, 1000000 + key FROM json_each(:add))
        WHERE q NOT IN (SELECT value FROM json_each(:remove))
        GROUP BY q ORDER BY min(n)))
WHERE id = :session_id AND expires_at > :now
RETURNING *;

-- name: task_publish
-- batch. The options of a task a worker serves, written in the transaction that opens its
-- session: the last worker to open a session decides a task's options.
INSERT INTO plunder_tasks (name, queue, pool, options, session_id, published_at)
VALUES (:name, :queue, :pool, :options, :session_id, :now)
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, pool = excluded.pool, options = excluded.options,
    session_id = excluded.session_id, published_at = excluded.published_at;

-- name: task_get
SELECT name, queue, pool, options, session_id, published_at FROM plunder_tasks
WHERE name = :name;

-- name: task_list
SELECT name, queue, pool, options, session_id, published_at FROM plunder_tasks ORDER BY name;

-- name: session_delete
DELETE FROM plunder_sessions WHERE id = :session_id RETURNING id;

-- name: session_list
SELECT * FROM plunder_sessions WHERE expires_at > :now ORDER BY started_at, id;

-- name: session_expired
SELECT id FROM plunder_sessions WHERE expires_at <= :now ORDER BY expires_at LIMIT :limit;

-- name: session_delete_many
DELETE FROM plunder_sessions
WHERE id IN (SELECT value FROM json_each(:session_ids)) AND expires_at <= :now
RETURNING id;

-- name: job_running_of_session
SELECT id, attempt, session_id, status FROM plunder_jobs
WHERE session_id = :session_id AND status = 'running';

-- name: job_lose_many
-- The running jobs of dead sessions, and of sessions that no longer exist (a claim that
-- committed after its session was reaped): back to pending at once while attempts remain
-- (the attempt that was lost counts) and the job's retry_on_lost allows, otherwise
-- timed_out. A rescued job keeps its place in the claim order (its run_at), so a backlog
-- cannot starve it, and counts the loss (a suspect after enough of them, see
-- job_claim_many). One not retried by its policy records plunder.WorkerLost, naming the
-- session (its JSON as payload.encode writes it), not :error.
UPDATE plunder_jobs
SET status = CASE WHEN retry_on_lost AND attempt < max_attempts THEN 'pending'
                  ELSE 'timed_out' END,
    -- a limited job goes back held (see limit_admit)
    run_at = CASE WHEN run_at < :now THEN run_at ELSE :now END
        + (limit_key IS NOT NULL AND retry_on_lost AND attempt < max_attempts) * 200000000000,
    finished_at = CASE WHEN retry_on_lost AND attempt < max_attempts THEN NULL ELSE :now END,
    error = CASE WHEN retry_on_lost THEN :error
                 ELSE '{"type":"plunder.WorkerLost","message":' || json_quote(
                     'the worker''s session ' || session_id || ' expired while this attempt '
                     || 'was running; not run again (retry_on_lost=False)')
                     || ',"traceback":""}' END,
    deadline_at = NULL,
    failed_sessions = json_insert(failed_sessions, '$[#]', session_id),
    losses = losses + 1,
    session_id = CASE WHEN retry_on_lost AND attempt < max_attempts THEN NULL
                      ELSE session_id END
WHERE status = 'running'
  AND (session_id IN (SELECT value FROM json_each(:session_ids))
       OR NOT EXISTS (SELECT 1 FROM plunder_sessions AS s
                      WHERE s.id = plunder_jobs.session_id))
-- the lost session: the one just appended to failed_sessions
RETURNING id, attempt, status, queue, json_extract(failed_sessions, '$[#-1]') AS session_id,
          error;

-- name: job_timeout_due
-- Running jobs past their deadline, and the session running each (job_timeout_many may
-- take it off the job; the timed-out run's history row names it).
SELECT id, attempt, session_id FROM plunder_jobs
WHERE status = 'running' AND deadline_at <= :now
ORDER BY deadline_at LIMIT :limit;

-- name: job_timeout_many
-- The jobs job_timeout_due found (:job_ids, a JSON list), in the same transaction:
-- retried at once when the job allows it and attempts remain, otherwise timed_out.
UPDATE plunder_jobs
SET status = CASE WHEN retry_on_timeout AND attempt < max_attempts THEN 'pending'
                  ELSE 'timed_out' END,
    -- a limited job goes back held (see limit_admit)
    run_at = :now + (limit_key IS NOT NULL AND retry_on_timeout
                     AND attempt < max_attempts) * 200000000000,
    finished_at = CASE WHEN retry_on_timeout AND attempt < max_attempts THEN NULL
                       ELSE :now END,
    error = :error,
    deadline_at = NULL,
    session_id = CASE WHEN retry_on_timeout AND attempt < max_attempts THEN NULL
                      ELSE session_id END
WHERE id IN (SELECT value FROM json_each(:job_ids)) AND status = 'running'
RETURNING id, attempt, status, queue;

-- name: job_expire_many
-- Pending jobs past their start-by deadline end expired, at most :limit a pass, the
-- earliest deadlines first (plunder_jobs_expires holds only pending jobs that have one).
-- They never ran: no session, no history row.
UPDATE plunder_jobs
SET status = 'expired', finished_at = :now, error = :error
WHERE id IN (SELECT id FROM plunder_jobs INDEXED BY plunder_jobs_expires
             WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= :now
             ORDER BY expires_at LIMIT :limit)
  AND status = 'pending'
RETURNING id, attempt, status, queue;

-- name: job_prune_find
-- Finished jobs past retention, the oldest ids first: what job_prune_many then deletes. A
-- read of its own, outside the write lock, which nobody else could take while it scans
-- (with nothing to prune, the whole table).
SELECT id FROM plunder_jobs
WHERE status IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'expired', 'skipped')
  AND finished_at < :now - :older_than
ORDER BY id
LIMIT :limit;

-- name: job_prune_many
-- Deletes the jobs job_prune_find found that are still finished past retention (their runs
-- and events go with them: foreign keys ON DELETE CASCADE).
DELETE FROM plunder_jobs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND status IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'expired', 'skipped')
  AND finished_at < :now - :older_than
RETURNING id;

-- name: lease_check
-- The fence for janitor writes: the caller still holds the lease under this term.
SELECT term FROM plunder_leases
WHERE name = :name AND holder = :holder AND term = :term AND expires_at > :now;

-- name: lease_acquire
-- Take a free or expired lease (the term grows), or renew our own live one (same term).
INSERT INTO plunder_leases (name, holder, term, acquired_at, expires_at)
VALUES (:name, :holder, 1, :now, :now + :ttl)
ON CONFLICT (name) DO UPDATE SET
    -- excluded.acquired_at is this statement's now
    term = CASE WHEN plunder_leases.holder = excluded.holder
                     AND plunder_leases.expires_at > excluded.acquired_at
                THEN plunder_leases.term ELSE plunder_leases.term + 1 END,
    acquired_at = CASE WHEN plunder_leases.holder = excluded.holder
                            AND plunder_leases.expires_at > excluded.acquired_at
                       THEN plunder_leases.acquired_at ELSE excluded.acquired_at END,
    holder = excluded.holder,
    expires_at = excluded.expires_at
WHERE plunder_leases.holder = excluded.holder
   OR plunder_leases.expires_at <= excluded.acquired_at
RETURNING *;

-- name: lease_renew
UPDATE plunder_leases SET expires_at = :now + :ttl
WHERE name = :name AND holder = :holder AND term = :term AND expires_at > :now
RETURNING *;

-- name: lease_release
-- The row stays, so that the next holder's term is still larger.
UPDATE plunder_leases SET expires_at = :now
WHERE name = :name AND holder = :holder AND term = :term
RETURNING *;

-- name: lease_get
SELECT * FROM plunder_leases WHERE name = :name;

-- name: queue_counts
SELECT queue, status, count(*) AS n FROM plunder_jobs GROUP BY queue, status;

-- name: job_unrunnable
-- Pending jobs that no live session can run, counted by task and queue: no live session
-- lists both their queue and their task. A read for people, as queue_counts. A
-- partition's queue ("q~3", migration 14) counts as its queue. Jobs that require labels
-- (migration 22) count apart: they also need a session holding those labels; so do jobs
-- of several slots (migration 23): they need a session with as many in all.
SELECT p.task, p.queue, p.require, p.cost, p.n FROM (
    SELECT task, CASE WHEN instr(queue, '~') > 0 THEN substr(queue, 1, instr(queue, '~') - 1)
                      ELSE queue END AS queue, require, cost, count(*) AS n
    FROM plunder_jobs
    WHERE status = 'pending' GROUP BY 1, 2, 3, 4
) AS p
WHERE NOT EXISTS (
    SELECT 1 FROM plunder_sessions AS s
    WHERE s.expires_at > :now
      AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = p.queue)
      AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = p.task)
      AND (p.require IS NULL OR NOT EXISTS (
          SELECT 1 FROM json_each('["' || replace(trim(p.require, '{}'), ',', '","') || '"]') AS a
          WHERE a.value NOT IN (SELECT value FROM json_each(s.labels))))
      AND p.cost <= s.slots)
ORDER BY p.task, p.queue, p.require IS NOT NULL, p.require, p.cost;

-- name: queue_oldest_pending
SELECT queue, :now - min(run_at) AS age FROM plunder_jobs
WHERE status = 'pending' AND run_at <= :now
GROUP BY queue;

-- name: job_next_due_level
-- The earliest run_at of a pending job of one of :tasks in one queue and priority level,
-- not past its start-by deadline: one probe of plunder_jobs_claim, which holds a level's
-- pending jobs in run_at order (the expired ones before it are stepped over).
SELECT j.run_at FROM plunder_jobs AS j INDEXED BY plunder_jobs_claim
WHERE j.status = 'pending'
  AND j.queue = :queue
  AND j.priority = :priority
  AND j.task IN (SELECT value FROM json_each(:tasks))
  AND (j.expires_at IS NULL OR j.expires_at > :now)  -- an expired job is no work
ORDER BY j.run_at, j.id
LIMIT 1;

-- name: job_next_due_rest
-- The earliest run_at of a pending job of one of :tasks in one queue below priority level
-- :below: after CLAIM_LEVELS levels, the rest of a queue with many levels in one walk, as
-- job_claim_rest.
SELECT min(j.run_at) AS run_at FROM plunder_jobs AS j INDEXED BY plunder_jobs_claim
WHERE j.status = 'pending'
  AND j.queue = :queue
  AND j.priority < :below
  AND j.task IN (SELECT value FROM json_each(:tasks))
  AND (j.expires_at IS NULL OR j.expires_at > :now);

-- name: session_get
SELECT * FROM plunder_sessions WHERE id = :session_id;

-- name: session_end_for_key
-- The live sessions a key opened, ended now (a revoked key): the janitor then treats them
-- as any expired session, their running jobs lost.
UPDATE plunder_sessions SET expires_at = :now
WHERE key_id = :key_id AND expires_at > :now
RETURNING id;

-- name: key_insert
INSERT INTO plunder_keys (id, name, role, key_group, queues, secret_hash, created_at,
                          expires_at)
VALUES (:key_id, :name, :role, :key_group, :queues, :secret_hash, :now, :now + :expires_in)
RETURNING *;

-- name: key_get
SELECT * FROM plunder_keys WHERE id = :key_id;

-- name: key_list
SELECT * FROM plunder_keys ORDER BY created_at, id;

-- name: key_revoke
-- Revoked once: a second revoke keeps the first time.
UPDATE plunder_keys SET revoked_at = COALESCE(revoked_at, :now)
WHERE id = :key_id
RETURNING *;

-- name: queue_group_take
-- The queues a key of a group names become that group's, unless another group has them.
INSERT INTO plunder_queue_groups (queue, group_name)
SELECT value, :group_name FROM json_each(:queues) WHERE true
ON CONFLICT (queue) DO NOTHING;

-- name: queue_group_list
SELECT queue, group_name FROM plunder_queue_groups ORDER BY queue;

-- name: limit_declare
-- batch. The limits a batch of jobs names, each made as its task declares it when it is
-- new (its rate's bucket full); one that exists keeps what it holds (limit_set changes it).
INSERT INTO plunder_limits (key, ceiling, rate_count, rate_period, tokens, refilled_at)
VALUES (:key, :ceiling, :rate_count, :rate_period, coalesce(:rate_count, 0), :now)
ON CONFLICT (key) DO NOTHING;

-- name: limit_set
-- A limit as a person or the API sets it: its ceiling and rate replaced.
INSERT INTO plunder_limits (key, ceiling, rate_count, rate_period, tokens, refilled_at)
VALUES (:key, :ceiling, :rate_count, :rate_period, coalesce(:rate_count, 0), :now)
ON CONFLICT (key) DO UPDATE
SET ceiling = excluded.ceiling, rate_count = excluded.rate_count,
    rate_period = excluded.rate_period,
    -- a rate new to the key starts with a full bucket, as a new limit does
    tokens = CASE WHEN plunder_limits.rate_count IS NULL THEN coalesce(excluded.rate_count, 0)
                  ELSE min(plunder_limits.tokens, coalesce(excluded.rate_count, 0)) END;

-- name: limit_lock
-- The first step of an admission (plunder.store.limits): the key's row, its rate's bucket
-- refilled (SQLite's writers take turns: the transaction holds the write lock already).
UPDATE plunder_limits
SET tokens = CASE WHEN rate_count IS NULL THEN 0 ELSE min(rate_count,
        tokens + max(:now - refilled_at, 0) * rate_count / rate_period) END,
    refilled_at = :now
WHERE key = :key
RETURNING key, ceiling, rate_count, tokens, coalesce(paused_until > :now, 0) AS paused;

-- name: limit_busy
-- The key's jobs that run or are admitted (pending, not held): what its ceiling bounds.
-- (64060588800: the year 4000, from which on a job is held.)
SELECT count(*) AS n FROM plunder_jobs
WHERE limit_key = :key AND status IN ('pending', 'running') AND run_at < 64060588800;

-- name: limit_admit
-- Up to :n of the key's held jobs that are due, the first due first, admitted: back to
-- their due time, where a claim takes them in their place. (A REAL that large keeps its
-- time to some 30 microseconds: a job admitted may be due that much later than it was.)
UPDATE plunder_jobs
SET run_at = run_at - 200000000000
WHERE id IN (
    SELECT h.id FROM plunder_jobs AS h
    WHERE h.limit_key = :key AND h.status = 'pending'
      AND h.run_at >= 64060588800 AND h.run_at <= :now + 200000000000
    ORDER BY h.run_at, h.id
    LIMIT :n)
RETURNING id, queue;

-- name: limit_spend
-- The rate's tokens an admission used (after limit_lock, in its transaction).
UPDATE plunder_limits SET tokens = tokens - :n WHERE key = :key;

-- name: limit_hold
-- The key's admitted jobs that no claim took yet, held again (a pause).
UPDATE plunder_jobs SET run_at = run_at + 200000000000
WHERE limit_key = :key AND status = 'pending' AND run_at < 64060588800
RETURNING id;

-- name: limit_pause
-- No admission of the key for :seconds seconds; a pause that ends later stays.
INSERT INTO plunder_limits (key, tokens, refilled_at, paused_until)
VALUES (:key, 0, :now, :now + :seconds)
ON CONFLICT (key) DO UPDATE
SET paused_until = max(coalesce(plunder_limits.paused_until, excluded.paused_until),
                       excluded.paused_until)
RETURNING paused_until;

-- name: limit_resume
UPDATE plunder_limits SET paused_until = NULL WHERE key = :key RETURNING key;

-- name: limit_due
-- The keys that are not paused and have held jobs that are due: the janitor's admissions.
-- One probe of plunder_jobs_limited per limit.
SELECT l.key FROM plunder_limits AS l
WHERE (l.paused_until IS NULL OR l.paused_until <= :now)
  AND EXISTS (SELECT 1 FROM plunder_jobs AS j
              WHERE j.limit_key = l.key AND j.status = 'pending'
                AND j.run_at >= 64060588800 AND j.run_at <= :now + 200000000000)
ORDER BY l.key;

-- name: limit_list
-- Every limit with its jobs running, admitted (pending, not held) and held; a pause that
-- has ended reads NULL. A read for people, as queue_counts.
SELECT l.key, l.ceiling, l.rate_count, l.rate_period,
       CASE WHEN l.paused_until > :now THEN l.paused_until END AS paused_until,
       count(j.id) FILTER (WHERE j.status = 'running') AS running,
       count(j.id) FILTER (WHERE j.status = 'pending' AND j.run_at < 64060588800) AS admitted,
       count(j.id) FILTER (WHERE j.status = 'pending' AND j.run_at >= 64060588800) AS held
FROM plunder_limits AS l
LEFT JOIN plunder_jobs AS j
  ON j.limit_key = l.key AND j.status IN ('pending', 'running')
GROUP BY l.key
ORDER BY l.key;
-- name: partition_declare
-- A queue's partitions (migration 14), declared anew: a changed count makes a new
-- generation (the janitor assigns the partitions again); the row as it is now.
INSERT INTO plunder_partitions (queue, partitions) VALUES (:queue, :partitions)
ON CONFLICT (queue) DO UPDATE
SET partitions = excluded.partitions, generation = plunder_partitions.generation + 1
WHERE plunder_partitions.partitions <> excluded.partitions;

-- name: partition_list
SELECT queue, partitions, generation FROM plunder_partitions ORDER BY queue;

-- name: partition_owner_list
SELECT queue, partition, session_id FROM plunder_partition_owners ORDER BY queue, partition;

-- name: partition_members
-- The live sessions, with their queues: those that may own partitions.
SELECT id, queues FROM plunder_sessions WHERE expires_at > :now ORDER BY id;

-- name: partition_owners_clear
-- A queue's assignment, before it is written anew (partition_owners_set).
DELETE FROM plunder_partition_owners WHERE queue = :queue;

-- name: partition_owners_set
-- :owners names the owner of each partition of the queue, in order.
INSERT INTO plunder_partition_owners (queue, partition, session_id)
SELECT :queue, CAST(key AS INTEGER), value FROM json_each(:owners) WHERE true;

-- name: partition_generation_next
-- A queue's assignment changed: its generation grows by one.
UPDATE plunder_partitions SET generation = generation + 1 WHERE queue = :queue
RETURNING generation;

-- name: partition_owned
-- For a session's heartbeat: every partitioned queue, its generation, and each partition
-- of it the session owns (NULL: none).
SELECT p.queue, p.partitions, p.generation, o.partition
FROM plunder_partitions AS p
LEFT JOIN plunder_partition_owners AS o ON o.queue = p.queue AND o.session_id = :session_id
ORDER BY p.queue, o.partition;

-- name: fair_declare
-- A fair queue (migration 21), declared anew with its weights (a JSON object).
INSERT INTO plunder_fair_queues (queue, weights) VALUES (:queue, :weights)
ON CONFLICT (queue) DO UPDATE SET weights = excluded.weights;

-- name: fair_backfill
-- A queue made fair: its pending jobs without a group join the group "default".
UPDATE plunder_jobs SET group_name = 'default'
WHERE queue = :queue AND status = 'pending' AND group_name IS NULL;

-- name: fair_queue_list
SELECT queue, weights FROM plunder_fair_queues ORDER BY queue;

-- name: fair_group_touch
-- batch. A group with jobs just enqueued, made where new at the lowest virtual time of its
-- queue: served within the current round.
INSERT INTO plunder_fair_groups (queue, group_name, vtime)
SELECT :queue, :group,
       coalesce((SELECT min(vtime) FROM plunder_fair_groups WHERE queue = :queue), 0)
WHERE true
ON CONFLICT (queue, group_name) DO NOTHING;

-- name: fair_turn
-- The next :groups groups of the fair queues :queues in turn (lowest virtual time first),
-- each with its weight and the highest virtual time of its queue.
SELECT g.queue, g.group_name, g.vtime,
       coalesce((SELECT CAST(w.value AS REAL)
                 FROM plunder_fair_queues AS f, json_each(f.weights) AS w
                 WHERE f.queue = g.queue AND w.key = g.group_name), 1.0) AS weight,
       (SELECT max(m.vtime) FROM plunder_fair_groups AS m WHERE m.queue = g.queue) AS top
FROM plunder_fair_groups AS g
WHERE g.queue IN (SELECT value FROM json_each(:queues))
ORDER BY g.vtime, g.queue, g.group_name
LIMIT :groups;

-- name: fair_walk
-- Up to :limit jobs of one group of a fair queue that a claim may take now, in claim order
-- (higher priority first, then oldest due): a range of plunder_jobs_fair, which never reads
-- the other groups' jobs (its own due later, of a higher priority than those due now, are
-- stepped over). Filters as job_claim_walk — labels preferred and required, no more slots
-- than this session has (migrations 22, 23) — but for the jobs this session failed (taken
-- again at once).
SELECT j.id, j.losses, j.priority, j.run_at, j.cost
FROM plunder_jobs AS j INDEXED BY plunder_jobs_fair
WHERE j.status = 'pending'
  AND j.group_name IS NOT NULL
  AND j.queue = :queue
  AND j.group_name = :group
  AND j.run_at <= :now
  -- after the last job this claim walked of the group, in claim order (NULL: from its first)
  AND (:after_id IS NULL OR j.priority < :after_priority
       OR (j.priority = :after_priority AND (j.run_at, j.id) > (:after_run_at, :after_id)))
  AND (j.expires_at IS NULL OR j.expires_at > :now)  -- not past its start-by deadline
  AND j.task IN (SELECT value FROM json_each(:tasks))
  AND (j.losses < :suspect_losses OR :take_suspect)
  AND (j.affinity IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.affinity, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id))))
    OR NOT EXISTS (
      SELECT 1 FROM plunder_sessions AS s
      WHERE s.free_until > :now AND s.free_slots >= j.cost AND s.labels != '[]'
        AND EXISTS (SELECT 1 FROM json_each(s.queues) AS q WHERE q.value = j.queue)
        AND EXISTS (SELECT 1 FROM json_each(s.tasks) AS t WHERE t.value = j.task)
        AND NOT EXISTS (
          SELECT 1 FROM json_each('["' || replace(replace(trim(
              j.affinity || coalesce(j.require, ''), '{}'), '}{', ','), ',', '","') || '"]') AS a
          WHERE a.value NOT IN (SELECT value FROM json_each(s.labels)))))
  AND (j.require IS NULL OR NOT EXISTS (
      SELECT 1 FROM json_each('["' || replace(trim(j.require, '{}'), ',', '","') || '"]') AS a
      WHERE a.value NOT IN (SELECT value FROM json_each((SELECT labels FROM plunder_sessions WHERE id = :session_id)))))
  AND (j.cost = 1 OR j.cost <= (SELECT slots FROM plunder_sessions WHERE id = :session_id))
ORDER BY j.priority DESC, j.run_at, j.id
LIMIT :limit;

-- name: fair_advance
-- batch. A group's turn taken: its virtual time moves on by :delta (slots taken / weight),
-- and to :floor at least (a group with no job due: behind every other).
UPDATE plunder_fair_groups SET vtime = max(vtime + :delta, coalesce(:floor, vtime + :delta))
WHERE queue = :queue AND group_name = :group;

-- name: fair_prune
-- The janitor's pass: groups with no pending job, and those of queues no longer fair, go.
DELETE FROM plunder_fair_groups
WHERE NOT EXISTS (SELECT 1 FROM plunder_jobs AS j
                  WHERE j.status = 'pending' AND j.group_name IS NOT NULL
                    AND j.queue = plunder_fair_groups.queue
                    AND j.group_name = plunder_fair_groups.group_name)
   OR NOT EXISTS (SELECT 1 FROM plunder_fair_queues AS f
                  WHERE f.queue = plunder_fair_groups.queue)
RETURNING queue;

-- name: fair_repair
-- The janitor's pass: every group with pending jobs in the fair queue :queue has its row
-- (one that went back to pending after its row was pruned: a retry, a rescue). The
-- groups are found one index probe each (a skip scan of plunder_jobs_fair).
WITH RECURSIVE seen(group_name) AS (
    SELECT (SELECT min(j.group_name) FROM plunder_jobs AS j
            WHERE j.status = 'pending' AND j.group_name IS NOT NULL AND j.queue = :queue)
    UNION ALL
    SELECT (SELECT min(j.group_name) FROM plunder_jobs AS j
            WHERE j.status = 'pending' AND j.group_name IS NOT NULL AND j.queue = :queue
              AND j.group_name > s.group_name)
    FROM seen AS s WHERE s.group_name IS NOT NULL
)
INSERT INTO plunder_fair_groups (queue, group_name, vtime)
SELECT :queue, s.group_name,
       coalesce((SELECT min(vtime) FROM plunder_fair_groups WHERE queue = :queue), 0)
FROM seen AS s WHERE s.group_name IS NOT NULL
ON CONFLICT (queue, group_name) DO NOTHING
RETURNING group_name;

-- name: fair_group_list
-- Each fair queue's groups in turn, with their weights.
SELECT g.queue, g.group_name, g.vtime,
       coalesce((SELECT CAST(w.value AS REAL)
                 FROM plunder_fair_queues AS f, json_each(f.weights) AS w
                 WHERE f.queue = g.queue AND w.key = g.group_name), 1.0) AS weight
FROM plunder_fair_groups AS g
ORDER BY g.queue, g.vtime, g.group_name;
-- Schedules (plunder.store.schedules; docs/guide/periodic.md) ----------------------------

-- name: schedule_lock
-- The schedule, for a change of it (the write lock is held already).
SELECT * FROM plunder_schedules WHERE name = :name;

-- name: schedule_list
-- Every schedule, or the one named (NULL: every one).
SELECT * FROM plunder_schedules WHERE :name IS NULL OR name = :name
ORDER BY name;

-- name: schedule_insert
INSERT INTO plunder_schedules (name, task, queue, cron, timezone, args, kwargs, catch_up,
                               paused, next_at, created_at, updated_at)
VALUES (:name, :task, :queue, :cron, :timezone, :args, :kwargs, :catch_up, :paused,
        :next_at, :now, :now)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: schedule_update
-- A new definition; its pause, its last tick and (unless the ticks changed) its next one kept.
UPDATE plunder_schedules
SET task = :task, queue = :queue, cron = :cron, timezone = :timezone, args = :args,
    kwargs = :kwargs, catch_up = :catch_up, next_at = :next_at, updated_at = :now
WHERE name = :name
RETURNING *;

-- name: schedule_pause
-- Paused or resumed; a resumed schedule's next tick is the first after the resume.
UPDATE plunder_schedules
SET paused = :paused, next_at = COALESCE(:next_at, next_at), updated_at = :now
WHERE name = :name
RETURNING *;

-- name: schedule_delete
DELETE FROM plunder_schedules WHERE name = :name RETURNING name;

-- name: schedule_due
-- The schedules with a tick due by now, the most overdue first.
SELECT * FROM plunder_schedules
WHERE paused = 0 AND next_at <= :now
ORDER BY next_at, name
LIMIT :limit;

-- name: schedule_advance
-- The compare-and-set that enqueues a schedule's ticks once: next_at moves past them only
-- from the value read in this transaction.
UPDATE plunder_schedules
SET next_at = :next_at, last_at = COALESCE(:last_at, last_at),
    last_job_id = COALESCE(:last_job_id, last_job_id), updated_at = :now
WHERE name = :name AND next_at = :was AND paused = 0
RETURNING name;
-- name: queue_pause
-- Pause a queue (migration 17): claims take none of its jobs; pausing a paused queue
-- changes nothing (no row returned).
INSERT INTO plunder_queue_pauses (queue, paused_at, reason) VALUES (:queue, :now, :reason)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: queue_resume
DELETE FROM plunder_queue_pauses WHERE queue = :queue RETURNING queue;

-- name: queue_pause_list
SELECT queue, paused_at, reason FROM plunder_queue_pauses ORDER BY queue;

-- name: observe_finished
-- Jobs that finished in the hour before :now, by queue and minute (0: the last minute). A
-- read for people (the dashboard's sparklines): it walks the job table, so callers keep
-- its answer a few seconds.
SELECT queue, CAST((:now - finished_at) / 60 AS INTEGER) AS ago, count(*) AS n
FROM plunder_jobs
WHERE finished_at > :now - 3600 AND finished_at <= :now
GROUP BY 1, 2;

-- name: observe_started
-- Jobs started in the hour before :now, by queue and minute, with their mean wait from
-- due to started (seconds).
SELECT queue, CAST((:now - started_at) / 60 AS INTEGER) AS ago, count(*) AS n,
       avg(max(started_at - run_at, 0)) AS wait
FROM plunder_jobs
WHERE started_at > :now - 3600 AND started_at <= :now
GROUP BY 1, 2;

-- name: observe_lost
-- The sessions whose runs were lost in the hour before :now (their worker died or its
-- session expired), with the jobs rescued from them: what the run history records of a
-- dead session once the janitor has reaped it.
SELECT session_id, worker, host, pid, count(*) AS n, min(started_at) AS first_started,
       max(finished_at) AS lost_at, json_group_array(job_id) AS job_ids
FROM plunder_runs
WHERE outcome = 'lost' AND finished_at > :now - 3600
GROUP BY session_id, worker, host, pid
ORDER BY lost_at DESC
LIMIT 100;

-- name: observe_jobs
-- Jobs newest first, keyset-paginated by id (:before: the last id of the page before),
-- each filter NULL for none: a queue (its partitions too), task, status, key, created
-- from :since to :until (seconds since the epoch), and the queues a key may see (:only, a
-- JSON list: only these; :hide: none of these).
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE (:queue IS NULL OR queue = :queue
       OR substr(queue, 1, length(:queue) + 1) = :queue || '~')
  AND (:status IS NULL OR status = :status)
  AND (:task IS NULL OR task = :task)
  AND (:key IS NULL OR key = :key)
  AND (:since IS NULL OR created_at >= :since)
  AND (:until IS NULL OR created_at < :until)
  AND (:only IS NULL OR (CASE WHEN instr(queue, '~') > 0
                              THEN substr(queue, 1, instr(queue, '~') - 1) ELSE queue END)
                        IN (SELECT value FROM json_each(:only)))
  AND (:hide IS NULL OR (CASE WHEN instr(queue, '~') > 0
                              THEN substr(queue, 1, instr(queue, '~') - 1) ELSE queue END)
                        NOT IN (SELECT value FROM json_each(:hide)))
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit;

-- name: observe_running
-- Each live session's running jobs, counted (plunder_jobs_running holds them by session).
SELECT session_id, count(*) AS n FROM plunder_jobs
WHERE status = 'running' AND session_id IS NOT NULL
GROUP BY session_id;
-- name: order_declare
-- batch. The ordered keys a batch of jobs names (migration 20), with what a failure does
-- as the latest enqueue says.
INSERT INTO plunder_ordered (key, on_failure) VALUES (:key, :on_failure)
ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure
WHERE plunder_ordered.on_failure <> excluded.on_failure;

-- name: order_lock_many
-- The first step of an ordered admission (plunder.store.ordering): those of :keys (a JSON
-- list) that are ordered keys, and whether each is paused. (SQLite's writers take turns:
-- the transaction holds the write lock already.)
SELECT o.key, coalesce(l.paused_until > :now, 0) AS paused
FROM plunder_ordered AS o
JOIN plunder_limits AS l ON l.key = o.key
WHERE o.key IN (SELECT value FROM json_each(:keys))
ORDER BY o.key;

-- name: order_admit_many
-- The head of each of :keys (ordered, not paused, a JSON list) that is free, admitted: its
-- pending job first enqueued, and only if it is due — a later job never passes it. Free:
-- no job of the key runs or is admitted (64060588800: the year 4000, from which on a job
-- is held), and none ended failed since its release if it stops on failure.
UPDATE plunder_jobs
SET run_at = run_at - 200000000000
WHERE id IN (
    SELECT (SELECT h.id FROM plunder_jobs AS h
            WHERE h.limit_key = o.key AND h.status = 'pending'
            ORDER BY h.id LIMIT 1)
    FROM plunder_ordered AS o
    WHERE o.key IN (SELECT value FROM json_each(:keys))
      AND NOT EXISTS (SELECT 1 FROM plunder_jobs AS b
                      WHERE b.limit_key = o.key AND b.status IN ('pending', 'running')
                        AND b.run_at < 64060588800)
      AND (o.on_failure = 'continue'
           OR NOT EXISTS (SELECT 1 FROM plunder_jobs AS f
                          WHERE f.limit_key = o.key
                            AND f.status IN ('failed', 'timed_out', 'expired')
                            AND f.id > o.released_through)))
  AND status = 'pending' AND run_at >= 64060588800 AND run_at <= :now + 200000000000
RETURNING id, queue;

-- name: order_release
-- A stopped key let go past the jobs of it that ended failed so far.
UPDATE plunder_ordered
SET released_through = max(released_through, coalesce(
    (SELECT max(id) FROM plunder_jobs
     WHERE limit_key = :key AND status IN ('failed', 'timed_out', 'expired')), 0))
WHERE key = :key
RETURNING released_through;

-- name: order_list
-- Every ordered key, with the failed job that stops it (NULL: none) and its jobs waiting.
SELECT o.key, o.on_failure,
       (SELECT min(f.id) FROM plunder_jobs AS f
        WHERE f.limit_key = o.key AND f.status IN ('failed', 'timed_out', 'expired')
          AND f.id > o.released_through) AS failed_job,
       (SELECT count(*) FROM plunder_jobs AS p
        WHERE p.limit_key = o.key AND p.status = 'pending') AS pending
FROM plunder_ordered AS o
ORDER BY o.key;

-- name: order_queue_set
INSERT INTO plunder_ordered_queues (queue, on_failure) VALUES (:queue, :on_failure)
ON CONFLICT (queue) DO UPDATE SET on_failure = excluded.on_failure;

-- name: order_queue_clear
DELETE FROM plunder_ordered_queues WHERE queue = :queue;

-- name: order_queue_list
SELECT queue, on_failure FROM plunder_ordered_queues ORDER BY queue;
-- Workflows (plunder.store.edges, migration 19) ------------------------------------------

-- name: edge_parents_mark
-- The parents of a graph being enqueued get children: their rows are written (so a parent
-- ending meanwhile waits for this transaction) and their status and queue read.
UPDATE plunder_jobs SET has_children = 1
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, status, queue;

-- name: edge_insert
-- :rows, a JSON array of [parent, child, policy]
INSERT INTO plunder_edges (parent_id, child_id, on_failure)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]')
FROM json_each(:rows);

-- name: edge_wait
-- Fresh children with parents not ended: waiting for that many.
UPDATE plunder_jobs SET status = 'waiting', parents_left = :parents_left
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending';

-- name: edge_doom
-- Fresh children of a parent that ended other than succeeded, whose edge skips or fails
-- them: they end at once, never run.
UPDATE plunder_jobs SET status = :status, finished_at = :now, error = :error
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'pending';

-- name: edge_list
-- The edges into or out of these jobs.
SELECT parent_id, child_id, on_failure FROM plunder_edges
WHERE parent_id IN (SELECT value FROM json_each(:ids))
UNION
SELECT parent_id, child_id, on_failure FROM plunder_edges
WHERE child_id IN (SELECT value FROM json_each(:ids))
ORDER BY parent_id, child_id;

-- name: edge_parent_results
-- What a child's parents ended with: each parent's status and result.
SELECT e.parent_id AS id, j.status, j.result
FROM plunder_edges AS e JOIN plunder_jobs AS j ON j.id = e.parent_id
WHERE e.child_id = :job_id
ORDER BY e.parent_id;

-- name: edge_parent_results_claimed
-- The same for a child's current attempt only (fenced by its claim): no row when the
-- claim is not current (or the job unknown), one row with a NULL id when it has no parents.
SELECT e.parent_id AS id, j.status, j.result
FROM plunder_jobs AS c
LEFT JOIN plunder_edges AS e ON e.child_id = c.id
LEFT JOIN plunder_jobs AS j ON j.id = e.parent_id
WHERE c.id = :job_id AND c.status = 'running' AND c.attempt = :attempt
  AND c.session_id = :session_id
ORDER BY e.parent_id;

-- name: flow_jobs
-- Every job of the workflow a job belongs to: those its edges join it to, either way.
WITH RECURSIVE member(id) AS (
    SELECT :job_id
    UNION
    SELECT e.child_id FROM plunder_edges AS e JOIN member AS m ON e.parent_id = m.id
    UNION
    SELECT e.parent_id FROM plunder_edges AS e JOIN member AS m ON e.child_id = m.id
)
SELECT j.id, j.queue, j.task, j.args, j.kwargs, j.priority, j.status, j.attempt,
       j.max_attempts, j.timeout, j.backoff_base, j.backoff_cap, j.retry_on_timeout, j.key,
       j.run_at, j.created_at, j.started_at, j.finished_at, j.deadline_at, j.session_id,
       j.result, j.error, j.failed_sessions, j.losses, j.retry_on_lost, j.expires_at,
       j.limit_key, j.affinity, j.require, j.cost
FROM plunder_jobs AS j JOIN member AS m ON j.id = m.id
ORDER BY j.id;

-- name: flow_cancel
-- The jobs of a workflow not started yet end cancelled; those running run on. Their
-- children settle as each edge says (plunder_jobs_settle).
UPDATE plunder_jobs
SET status = 'cancelled', finished_at = :now, deadline_at = NULL, error = :error
WHERE id IN (SELECT value FROM json_each(:ids)) AND status IN ('pending', 'waiting')
RETURNING id, queue, status, limit_key;
-- name: trace_put_many
-- The trace context of jobs just enqueued (:ids, JSON), where the producer traced; a keyed
-- enqueue that found its job active keeps the context it was first enqueued under.
INSERT INTO plunder_traces (job_id, context)
SELECT value, :context FROM json_each(:ids) WHERE true
ON CONFLICT (job_id) DO NOTHING;

-- name: trace_get_many
-- The trace contexts of jobs just claimed (:ids, JSON), where they have one.
SELECT job_id, context FROM plunder_traces WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: queue_active_counts
-- Each queue's pending and running jobs, and the age of its oldest pending job that is due
-- (NULL for running): for metrics at scrape time, read from the partial indexes of those
-- statuses, never the finished jobs.
SELECT queue, 'pending' AS status, count(*) AS n,
       :now - min(CASE WHEN run_at <= :now THEN run_at END) AS age
FROM plunder_jobs WHERE status = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running' AS status, count(*) AS n, NULL AS age
FROM plunder_jobs WHERE status = 'running' GROUP BY queue;
