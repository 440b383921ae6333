-- plunder's runtime SQL for PostgreSQL. An operation SQLite has too carries the same name in
-- ../sqlite/queries.sql, with the same parameters and the same result columns; the names
-- only this dialect has are declared in plunder.store.queries.DIALECT_ONLY.
--
-- %(now)s is NULL in production and a timestamp in tests; NULL means the database clock.
-- statement_timestamp(), not now(): now() is frozen at transaction start.
-- Batch queries (marked "batch") receive each row parameter as an array and process every
-- row in one statement through unnest(); scalar parameters such as now stay scalar.

-- name: clock_now
SELECT statement_timestamp() AS now;

-- name: settings_set
-- This transaction's timeouts (milliseconds; 0 = none), and no JIT (see connections.pool_options),
-- where the server refused them as startup options (a transaction pooler) or the store limits
-- its calls otherwise (a worker's janitor on the worker's connections, which then also goes
-- by a name of its own, NULL: the connection's). set_config(name, v, true) ends with the
-- transaction, like SET LOCAL, so nothing stays on a server connection others share.
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, true),
       set_config('jit', 'off', true),
       set_config('application_name',
                  COALESCE(%(application_name)s::text, current_setting('application_name')),
                  true);

-- name: schema_table_exists
SELECT count(*) AS n FROM pg_catalog.pg_tables
WHERE schemaname = current_schema() AND tablename = 'plunder_schema';

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
-- Concurrent migrators queue up here; each sees the version the previous one left.
SELECT version FROM plunder_schema WHERE id = 1 FOR UPDATE;

-- name: schema_version_set
UPDATE plunder_schema SET version = %(version)s WHERE id = 1;

-- name: job_insert
-- batch. The jobs of one batch share their options (queue, task, priority, …), bound once;
-- each row brings its args, kwargs and key. A key that names an active job inserts
-- nothing; the store then reads that job. ORDER BY seq (each row's place in the input)
-- makes ids follow the input order, which the store relies on to match rows.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_jobs (
    queue, task, args, kwargs, priority, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at,
    retry_on_lost, expires_at, limit_key, group_name, affinity, require, cost
)
SELECT %(queue)s::text, %(task)s::text, u.args, u.kwargs, %(priority)s::int,
       %(max_attempts)s::int, %(timeout)s::float8, %(backoff_base)s::float8,
       %(backoff_cap)s::float8, %(retry_on_timeout)s::bool, u.key,
       clock.now + %(delay)s::float8 * interval '1 second'
           + (%(limit)s::text IS NOT NULL)::int * interval '200000000000 seconds', clock.now,
       %(retry_on_lost)s::bool, clock.now + %(expires_in)s::float8 * interval '1 second',
       %(limit)s::text, %(group)s::text, %(affinity)s::text, %(require)s::text, %(cost)s::int
FROM unnest(%(seq)s::int[], %(args)s::text[], %(kwargs)s::text[], %(key)s::text[])
         AS u(seq, args, kwargs, key),
     clock
ORDER BY u.seq
ON CONFLICT (key) WHERE key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING
RETURNING id, key, task, queue, created_at, run_at, expires_at;

-- name: job_insert_notify
-- job_insert, which also wakes the workers of the queues it inserted into when the
-- transaction commits: an enqueue makes one round trip fewer than with a separate notify.
-- A list of queues too long for one notification (8000 bytes) says "*", every queue.
-- The store uses it only where the database delivers notifications (Store.notifies).
WITH inserted AS (
/* include: job_insert */
),
woken AS (
    SELECT pg_notify(
        'plunder_enqueued', CASE WHEN octet_length(names) < 7900 THEN names ELSE '*' END
    )
    FROM (SELECT string_agg(DISTINCT queue, ',') AS names FROM inserted) AS q
    WHERE names IS NOT NULL
      AND EXISTS (SELECT 1 FROM plunder_listeners AS l
                  WHERE 'plunder_enqueued' = ANY(l.channels)
                    AND l.expires_at > statement_timestamp())
)
SELECT inserted.* FROM inserted LEFT JOIN woken ON true;

-- name: job_insert_mixed
-- batch. job_insert for jobs that do not share their options: each row brings its own.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_jobs (
    queue, task, args, kwargs, priority, max_attempts, timeout,
    backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at,
    retry_on_lost, expires_at, limit_key, group_name, affinity, require, cost
)
SELECT u.queue, u.task, u.args, u.kwargs, u.priority, u.max_attempts, u.timeout,
       u.backoff_base, u.backoff_cap, u.retry_on_timeout, u.key,
       clock.now + u.delay * interval '1 second'
           + (u.limit_key IS NOT NULL)::int * interval '200000000000 seconds', clock.now,
       u.retry_on_lost, clock.now + u.expires_in * interval '1 second', u.limit_key,
       u.group_name, u.affinity, u.require, u.cost
FROM unnest(
    %(seq)s::int[], %(queue)s::text[], %(task)s::text[], %(args)s::text[],
    %(kwargs)s::text[], %(priority)s::int[], %(max_attempts)s::int[], %(timeout)s::float8[],
    %(backoff_base)s::float8[], %(backoff_cap)s::float8[], %(retry_on_timeout)s::bool[],
    %(key)s::text[], %(delay)s::float8[], %(retry_on_lost)s::bool[],
    %(expires_in)s::float8[], %(limit)s::text[], %(group)s::text[], %(affinity)s::text[],
    %(require)s::text[], %(cost)s::int[]
) AS u(seq, queue, task, args, kwargs, priority, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, delay, retry_on_lost, expires_in,
       limit_key, group_name, affinity, require, cost),
     clock
ORDER BY u.seq
ON CONFLICT (key) WHERE key IS NOT NULL AND status IN ('pending', 'running') DO NOTHING
RETURNING id, key, task, queue, created_at, run_at, expires_at;

-- name: job_insert_mixed_notify
-- job_insert_notify for job_insert_mixed.
WITH inserted AS (
/* include: job_insert_mixed */
),
woken AS (
    SELECT pg_notify(
        'plunder_enqueued', CASE WHEN octet_length(names) < 7900 THEN names ELSE '*' END
    )
    FROM (SELECT string_agg(DISTINCT queue, ',') AS names FROM inserted) AS q
    WHERE names IS NOT NULL
      AND EXISTS (SELECT 1 FROM plunder_listeners AS l
                  WHERE 'plunder_enqueued' = ANY(l.channels)
                    AND l.expires_at > statement_timestamp())
)
SELECT inserted.* FROM inserted LEFT JOIN woken ON true;

-- name: job_get_active_by_keys
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE key = ANY(%(keys)s::text[]) AND status IN ('pending', 'running');

-- name: job_get
-- A job's own columns (every read of jobs): not the run kept on it (run_*, see job_runs).
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs WHERE id = %(job_id)s;

-- name: job_claim_many
-- Claim up to %(limit)s pending jobs, best first, for a live session; rows another claimer
-- holds are skipped, not waited for. A job that this session already failed is left to
-- another live session that runs its queue and task and has a free slot (as of its last
-- heartbeat), while there is one; otherwise it is taken at once. Suspects (jobs lost with
-- their worker suspect_losses times or more) are taken only when take_suspect is true (the
-- worker runs none), and then at most one: the first in claim order (one picked beyond it
-- stays locked, unclaimed, until this commit). A job past its start-by deadline that the
-- janitor has not ended yet is stepped over by the walk (a filter on the row it reads
-- anyway, checked again on the row it locks): never claimed, never holding a place of the
-- LIMIT nor a lock the janitor's sweep would skip.
-- What it reads does not grow with the number of jobs due later, nor with other queues'.
-- plunder_jobs_claim holds each queue's pending jobs in claim order, and within one
-- priority level the jobs due now come before those due later. So each of the worker's
-- queues is read on its own (`queue = q.name`), one priority level at a time, best first
-- (`levels`: one index probe per level), and within a level only while `run_at <= now` (an
-- index bound, not a filter): a claim that finds fewer jobs than it asks for stops at the
-- first job due later instead of walking every delayed job behind it. The levels are read
-- in order and the walk stops at LIMIT rows, so lower levels are not even probed when the
-- first fills the claim. A queue with more levels than the parameter `levels` says (the
-- store's CLAIM_LEVELS; a priority used as a score) would cost a probe per level, so below
-- the last of those the rest of the queue is walked in one go, in claim order, the jobs due
-- later included (`rest`).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
/* include: job_claim_steps */
SELECT * FROM claimed;

-- name: job_claim_levels
-- A fragment (never run alone) of job_claim_steps and job_next_due, inside a LATERAL join
-- over the worker's queues (`q.name`): the recursive step `levels` lists the best `levels`
-- priority levels of one queue's pending jobs, best first, one index probe each, with the
-- first of each level's jobs in claim order (`run_at`, `id`): what comes before it in
-- plunder_jobs_claim this statement cannot see (claimed or finished since they were
-- indexed: entries only VACUUM removes, which a queue drained without pause piles up at
-- the head of each level), so the claim's walk of the level starts there instead of
-- stepping over them again.
levels AS (
    (SELECT j.priority, j.run_at, j.id, 1 AS n FROM plunder_jobs AS j
     WHERE j.status = 'pending' AND j.queue = q.name
     ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1)
    UNION ALL
    SELECT lo.priority, lo.run_at, lo.id, l.n + 1 FROM levels AS l, LATERAL (
        SELECT j.priority, j.run_at, j.id FROM plunder_jobs AS j
        WHERE j.status = 'pending' AND j.queue = q.name AND j.priority < l.priority
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) AS lo
    WHERE l.n < %(levels)s::int
)

-- name: job_claim_steps
-- The claim's steps, after a `clock` step: the common table expressions of job_claim_many
-- and of job_exchange (a fragment, never run alone). Its last step, `claimed`, holds the
-- claimed rows. Spelled short (comma-joined LATERALs): the turn must stay under psycopg's
-- 4 KiB query cache (see queries.compact).
picked AS (
    SELECT c.* FROM clock, unnest(%(queues)s::text[]) AS q(name), LATERAL (
        WITH RECURSIVE /* include: job_claim_levels */,
        -- the other live sessions of this queue that have a free slot, for the jobs this
        -- session failed (read only for those; spelled short, as the turn must stay under
        -- psycopg's 4 KiB query cache)
        peers AS (SELECT s.id, s.tasks FROM plunder_sessions s WHERE s.expires_at > clock.now
                  AND s.free_slots > 0 AND q.name = ANY(s.queues)),
        -- the labelled sessions of this queue with a free slot reported lately (h), and
        -- this session's labels (m): read only for jobs with affinity (migration 22)
        h AS (SELECT s.labels, s.tasks, s.free_slots FROM plunder_sessions s
              WHERE s.free_until > clock.now
              AND s.free_slots > 0 AND s.labels <> '{}' AND q.name = ANY(s.queues)),
        m AS (SELECT labels FROM plunder_sessions WHERE id = %(session_id)s),
        -- this session's slots in all, read only for jobs of several (migration 23)
        k AS (SELECT slots FROM plunder_sessions WHERE id = %(session_id)s)
        SELECT due.* FROM levels AS l, LATERAL (
            SELECT j.id, j.priority, j.run_at, j.losses, j.cost FROM plunder_jobs AS j
            WHERE j.status = 'pending'
              AND j.queue = q.name
              AND j.priority = l.priority
              -- from the level's first job on (see job_claim_levels): an index bound
              AND (j.run_at, j.id) >= (l.run_at, l.id)
              AND j.run_at <= clock.now
              -- not past its start-by deadline (NULL: none)
              AND (j.expires_at IS NULL OR j.expires_at > clock.now)
              AND j.task = ANY(%(tasks)s::text[])
              AND (j.losses < %(suspect_losses)s OR %(take_suspect)s)
              AND NOT (j.failed_sessions <> '{}' AND %(session_id)s = ANY(j.failed_sessions)
                  AND EXISTS (SELECT FROM peers p
                              WHERE j.task = ANY(p.tasks) AND p.id <> ALL(j.failed_sessions)))
              -- preferred: held here, or by no holder with its cost free; required: here
              AND (j.affinity IS NULL OR j.affinity::text[] <@ (TABLE m)
                   OR NOT EXISTS (SELECT FROM h WHERE j.task = ANY(h.tasks)
                                  AND h.free_slots >= j.cost
                                  AND j.affinity::text[] || j.require::text[] <@ h.labels))
              AND (j.require IS NULL OR j.require::text[] <@ (TABLE m))
              -- no more slots than this worker has: left to a bigger one
              AND (j.cost = 1 OR j.cost <= (TABLE k))
            ORDER BY j.run_at, j.id
            LIMIT %(limit)s
            FOR UPDATE OF j SKIP LOCKED
        ) AS due
        UNION ALL
        SELECT rest.* FROM (SELECT min(priority) AS below FROM levels
                  HAVING count(*) = %(levels)s::int) AS b, LATERAL (
            SELECT j.id, j.priority, j.run_at, j.losses, j.cost FROM plunder_jobs AS j
            WHERE j.status = 'pending'
              AND j.queue = q.name
              AND j.priority < b.below
              AND j.run_at <= clock.now
              -- not past its start-by deadline (NULL: none)
              AND (j.expires_at IS NULL OR j.expires_at > clock.now)
              AND j.task = ANY(%(tasks)s::text[])
              AND (j.losses < %(suspect_losses)s OR %(take_suspect)s)
              AND NOT (j.failed_sessions <> '{}' AND %(session_id)s = ANY(j.failed_sessions)
                  AND EXISTS (SELECT FROM peers p
                              WHERE j.task = ANY(p.tasks) AND p.id <> ALL(j.failed_sessions)))
              -- preferred: held here, or by no holder with its cost free; required: here
              AND (j.affinity IS NULL OR j.affinity::text[] <@ (TABLE m)
                   OR NOT EXISTS (SELECT FROM h WHERE j.task = ANY(h.tasks)
                                  AND h.free_slots >= j.cost
                                  AND j.affinity::text[] || j.require::text[] <@ h.labels))
              AND (j.require IS NULL OR j.require::text[] <@ (TABLE m))
              -- no more slots than this worker has: left to a bigger one
              AND (j.cost = 1 OR j.cost <= (TABLE k))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT %(limit)s
            FOR UPDATE OF j SKIP LOCKED
        ) AS rest
        LIMIT %(limit)s
    ) AS c
    WHERE EXISTS (SELECT FROM plunder_sessions
                  WHERE id = %(session_id)s AND expires_at > clock.now)
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
-- every job picked but the suspects, and the first suspect in claim order (picked holds
-- none unless take_suspect): two scans of picked, not a sort and a window over it
chosen AS (
    SELECT * FROM picked WHERE losses < %(suspect_losses)s
    UNION ALL
    (SELECT * FROM picked WHERE losses >= %(suspect_losses)s
     ORDER BY priority DESC, run_at, id LIMIT 1)
),
-- in claim order while their costs fit the slots offered (the limit): the first that does
-- not fit ends the claim, so cheaper jobs behind a costly one wait with it (decision 0019)
fits AS (
    SELECT id FROM (SELECT id, sum(cost) OVER (ORDER BY priority DESC, run_at, id) AS used
                    FROM chosen) AS c
    WHERE used <= %(limit)s
),
claimed AS (
    UPDATE plunder_jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        session_id = %(session_id)s,
        started_at = clock.now,
        finished_at = NULL,
        deadline_at = clock.now + j.timeout * interval '1 second',
        -- who runs this attempt: its history row names them even if the session is gone
        run_worker = me.name, run_host = me.host, run_pid = me.pid
    FROM clock,
         (SELECT name, host, pid FROM plunder_sessions WHERE id = %(session_id)s) AS me
    -- by primary key, one probe per chosen id, whatever the planner guesses of how many
    -- rows the walk above returns: the statement is prepared with a generic plan, which
    -- cannot know LIMIT and would otherwise join the chosen ids to a scan of every job
    WHERE j.id = ANY(ARRAY(SELECT id FROM fits))
    -- the job's own columns, not the run kept on it once it succeeds (run_*); unqualified,
    -- as no other relation here has columns of those names (a shorter statement to send)
    RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts,
              timeout, backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at,
              started_at, finished_at, deadline_at, session_id, result, error,
              failed_sessions, losses, retry_on_lost, expires_at, limit_key, affinity,
              require, cost
),
-- a labelled session's free slots after this claim (the slots it asked to fill, less
-- the costs of what it took), counted by others' claims for 2 s (see migration 22)
reported AS (
    UPDATE plunder_sessions AS s
    SET free_slots = GREATEST(%(limit)s - (SELECT COALESCE(sum(cost), 0) FROM claimed), 0),
        free_until = clock.now + LEAST(s.expiry, 2.0) * interval '1 second'
    FROM clock WHERE s.id = %(session_id)s AND s.labels <> '{}' AND s.expires_at > clock.now
)

-- name: session_free
-- A labelled session's free slots after a claim of several statements (a fair queue's,
-- plunder.store.fairness): the slots it asked to fill, less the costs of all it took,
-- counted by others' claims for 2 s (see migration 22); in the claim's transaction, as
-- job_claim_many's `reported` step.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_sessions AS s
SET free_slots = GREATEST(%(free_slots)s::integer, 0),
    free_until = clock.now + LEAST(s.expiry, 2.0) * interval '1 second'
FROM clock WHERE s.id = %(session_id)s AND s.labels <> '{}' AND s.expires_at > clock.now;

-- name: job_exchange
-- A worker's turn in one statement: job_complete_notify over its finished jobs, then
-- job_claim_many, committed together in one round trip (a transaction of the two costs
-- four: BEGIN, each statement, COMMIT). The two update different rows (running jobs of
-- this session; pending ones). `acked` counts the jobs completed, `children` says whether
-- one of them had children (pending now, maybe: the claim, which reads the statement's
-- snapshot, cannot see them; the worker claims again at once); with nothing claimed, one
-- row of NULLs carries them.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
done AS (
/* include: job_complete_update */
),
told AS (
    SELECT pg_notify('plunder_done', string_agg(id::text, ',')) FROM done
    WHERE EXISTS (SELECT FROM plunder_listeners
                  WHERE 'plunder_done' = ANY(channels) AND expires_at > statement_timestamp())
    GROUP BY id / 300
),
/* include: job_claim_steps */
SELECT (SELECT count(*) FROM done) AS acked,
       EXISTS (SELECT FROM done WHERE has_children) AS children, c.*
FROM (SELECT count(*) FROM told) AS t LEFT JOIN claimed AS c ON true;

-- name: plans_by_index
-- Sent just before the first run on a pooled connection of a statement a worker repeats
-- (a turn, a claim, an acknowledgement: tx.INDEX_PLANNED), with plans_reset just after
-- it, in the same transaction where there is one. That run prepares the statement, and the
-- plan made then (a generic plan, see connections.pool_options) serves every later run
-- on the connection, until new statistics of the jobs table make the server plan it again.
-- Made while the statistics said the table was nearly empty, a turn's plan read the whole
-- table at every turn to find the jobs it acknowledged (a sequential scan costs next to
-- nothing on an empty table) and kept doing so as the table filled (measured in
-- docs/decisions/0006-statistics-and-plans.md). With sequential scans off the
-- planner takes an index wherever one serves, and these statements have one for every
-- step. (A plan made again later is made for the statistics of then; the janitor takes
-- new ones as the table grows, see job_table_pages.)
SET enable_seqscan = off;

-- name: plans_reset
-- The connection's own setting again, once the statement's plan is made (see
-- plans_by_index): whatever else runs there is planned as the server would.
RESET enable_seqscan;

-- name: run_close
-- batch. The history row of an attempt that ended other than in success, written once, as
-- it ends, after the statement that ended it, in the same transaction: its worker and start
-- from the job, where the claim wrote them (from the session, for an attempt an earlier
-- plunder claimed). A row that is already there keeps its first outcome; one an earlier
-- plunder opened is closed here. An attempt the batch names twice is written once, from its
-- first mention (an upsert may not write one row twice).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, started_at,
                          finished_at, outcome, error, logs)
SELECT DISTINCT ON (u.job_id, u.attempt) u.job_id, u.attempt, u.session_id, COALESCE(j.run_worker, s.name, ''),
       COALESCE(j.run_host, s.host, ''), COALESCE(j.run_pid, s.pid, 0),
       COALESCE(j.started_at, clock.now), clock.now, u.outcome, u.error, u.logs
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(session_id)s::text[],
            %(outcome)s::text[], %(error)s::text[], %(logs)s::text[]) WITH ORDINALITY
         AS u(job_id, attempt, session_id, outcome, error, logs, n)
CROSS JOIN clock
JOIN plunder_jobs AS j ON j.id = u.job_id AND j.attempt = u.attempt
LEFT JOIN plunder_sessions AS s ON s.id = u.session_id
WHERE u.session_id IS NOT NULL
ORDER BY u.job_id, u.attempt, u.n
ON CONFLICT (job_id, attempt) DO UPDATE
SET finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error,
    logs = excluded.logs
WHERE plunder_runs.outcome IS NULL;

-- name: run_mark_stale
-- batch. A completion or failure refused by the fence is recorded as a stale run, if the
-- attempt still runs under that session (its session expired and the reaper has not been
-- yet). Any other refused attempt has its row already (lost, timed out, cancelled), or
-- succeeded (the task's own transaction acknowledged it: its run is on the job), or was
-- never this session's. An attempt the batch names twice is written once, from its first
-- mention (an upsert may not write one row twice).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, started_at,
                          finished_at, outcome, logs)
SELECT DISTINCT ON (j.id) j.id, j.attempt, j.session_id, COALESCE(j.run_worker, s.name, ''),
       COALESCE(j.run_host, s.host, ''), COALESCE(j.run_pid, s.pid, 0), j.started_at,
       clock.now, 'stale', u.logs
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(session_id)s::text[], %(logs)s::text[])
         WITH ORDINALITY AS u(job_id, attempt, session_id, logs, n)
CROSS JOIN clock
JOIN plunder_jobs AS j
  ON j.id = u.job_id AND j.attempt = u.attempt AND j.session_id = u.session_id
     AND j.status = 'running'
LEFT JOIN plunder_sessions AS s ON s.id = u.session_id
WHERE j.started_at IS NOT NULL
ORDER BY j.id, u.n
ON CONFLICT (job_id, attempt) DO UPDATE
SET finished_at = excluded.finished_at, outcome = 'stale', logs = excluded.logs
WHERE plunder_runs.outcome IS NULL AND plunder_runs.session_id = excluded.session_id;

-- name: session_alive
SELECT id FROM plunder_sessions
WHERE id = %(session_id)s
  AND expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp());

-- name: job_complete
-- batch; the store counts the rows it returns, one per job it completed. Fenced: only the
-- current claim of a running job, under a live session. A reaper updating the same row
-- first makes this one re-check its WHERE clause and match nothing. The run that succeeded
-- is kept on the job (its worker, written by the claim, and its logs; see migration 0006):
-- no history row is written.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
/* include: job_complete_update */;

-- name: job_complete_update
-- job_complete's UPDATE after its `clock` step (a fragment, never run alone): job_exchange
-- runs it after the clock of the whole turn.
UPDATE plunder_jobs AS j
SET status = 'succeeded', result = u.result, finished_at = clock.now, deadline_at = NULL,
    run_logs = u.logs
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(claim_session)s::text[],
            %(result)s::text[], %(logs)s::text[])
         AS u(job_id, attempt, session_id, result, logs),
     clock
WHERE j.id = u.job_id AND j.attempt = u.attempt
  -- not "=": the planner would look rows up through the session's running jobs (each
  -- probe walking all of them) instead of by id; u.session_id is never NULL
  AND j.session_id IS NOT DISTINCT FROM u.session_id
  -- not "status = 'running'" either: that matches plunder_jobs_running's predicate, and
  -- the planner then reads every running job of every worker (and the index's dead
  -- entries) to hash-join the batch, instead of looking its ids up
  AND (j.status || '') = 'running'
  -- the batch's live sessions, looked up once (an init plan): a batch is one worker's,
  -- and a lookup per job cost a tenth of the statement; not a join or EXISTS either,
  -- which would start the plan from the session
  AND u.session_id = ANY(ARRAY(
      SELECT s.id FROM plunder_sessions AS s, clock AS c
      WHERE s.id = ANY(%(claim_session)s::text[]) AND s.expires_at > c.now))
RETURNING j.id, j.has_children;

-- name: job_complete_notify
-- job_complete, which also tells the result waiters of the jobs it completed when the
-- transaction commits ('plunder_done', one notification for each block of 300 ids it
-- completed jobs in, under the 8000-byte limit): no separate notify, so an acknowledgement
-- on its own is one statement, committed in one round trip. The store uses it only where the database delivers
-- notifications (Store.notifies).
WITH done AS (
/* include: job_complete */
),
told AS (
    SELECT pg_notify('plunder_done', string_agg(id::text, ',')) FROM done
    WHERE EXISTS (SELECT FROM plunder_listeners
                  WHERE 'plunder_done' = ANY(channels) AND expires_at > statement_timestamp())
    GROUP BY id / 300
)
SELECT done.id FROM done WHERE (SELECT count(*) FROM told) >= 0;

-- name: job_fail
-- batch. Fenced like job_complete. Retried (back to pending after delay seconds) when
-- retry is true and attempts remain; otherwise the job ends in final_status.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = CASE WHEN u.retry AND j.attempt < j.max_attempts THEN 'pending'
                  ELSE u.final_status END,
    -- a limited job goes back held (see limit_admit)
    run_at = CASE WHEN u.retry AND j.attempt < j.max_attempts
                  THEN clock.now + u.delay * interval '1 second'
                       + (j.limit_key IS NOT NULL)::int * interval '200000000000 seconds'
                  ELSE j.run_at END,
    finished_at = CASE WHEN u.retry AND j.attempt < j.max_attempts THEN NULL ELSE clock.now END,
    session_id = CASE WHEN u.retry AND j.attempt < j.max_attempts THEN NULL
                      ELSE j.session_id END,
    error = u.error,
    deadline_at = NULL,
    failed_sessions = array_append(j.failed_sessions, u.session_id),
    losses = 0  -- it ran to an outcome and its worker lived: not a suspect
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(session_id)s::text[],
            %(error)s::text[], %(retry)s::bool[], %(delay)s::float8[],
            %(final_status)s::text[])
         AS u(job_id, attempt, session_id, error, retry, delay, final_status),
     clock
WHERE j.id = u.job_id AND j.attempt = u.attempt
  -- not "=": the planner would look rows up through the session's running jobs (each
  -- probe walking all of them) instead of by id; u.session_id is never NULL
  AND j.session_id IS NOT DISTINCT FROM u.session_id
  -- not "status = 'running'" either: that matches plunder_jobs_running's predicate, and
  -- the planner then reads every running job of every worker (and the index's dead
  -- entries) to hash-join the batch, instead of looking its ids up
  AND (j.status || '') = 'running'
  -- a scalar subquery, not EXISTS: a semi-join would start the plan from the session
  AND (SELECT s.expires_at FROM plunder_sessions AS s WHERE s.id = u.session_id) > clock.now
RETURNING j.id, j.attempt, u.session_id AS session_id, j.status, j.queue;

-- name: job_release
-- batch. Graceful shutdown gives a running job back: pending at once, and the attempt it
-- used is not counted against max_attempts. started_at stays, as after a failed attempt:
-- the released run's history row reads it (run_close).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = 'pending', session_id = NULL, deadline_at = NULL,
    max_attempts = j.max_attempts + 1,
    -- a limited job goes back held (see limit_admit)
    run_at = clock.now + (j.limit_key IS NOT NULL)::int * interval '200000000000 seconds'
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(session_id)s::text[])
         AS u(job_id, attempt, session_id),
     clock
WHERE j.id = u.job_id AND j.attempt = u.attempt AND j.session_id = u.session_id
  AND j.status = 'running'
RETURNING j.id, j.attempt, u.session_id AS session_id, j.status, j.queue;

-- name: job_abandon
-- batch. Graceful shutdown past the grace period stopped this attempt's task, which had
-- started (a thread may even run on): a job whose retry_on_lost is off ends timed_out with
-- error (plunder.WorkerLost) and is not run again, as job_lose_many ends it when its
-- worker is lost; the store releases the others (job_release). Fenced by the claim.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = 'timed_out', finished_at = clock.now, error = %(error)s, deadline_at = NULL,
    failed_sessions = array_append(j.failed_sessions, u.session_id),
    losses = j.losses + 1
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(session_id)s::text[])
         AS u(job_id, attempt, session_id),
     clock
WHERE j.id = u.job_id AND j.attempt = u.attempt AND j.session_id = u.session_id
  AND j.status = 'running' AND NOT j.retry_on_lost
RETURNING j.id, j.attempt, u.session_id AS session_id, j.status, j.queue;

-- name: job_claim_state
SELECT id, attempt, session_id, status FROM plunder_jobs
WHERE id = ANY(%(job_ids)s::bigint[]);

-- name: session_running
-- What the database says this session runs: the heartbeat compares it with what the worker
-- says it runs, to find claims whose answer never reached the worker.
SELECT id, attempt, session_id FROM plunder_jobs
WHERE session_id = %(session_id)s AND status = 'running';

-- name: job_check_claim
-- The fence for writes that are not state changes (stream events). FOR SHARE holds off a
-- concurrent reaper or cancel until this transaction ends.
SELECT j.id FROM plunder_jobs AS j
WHERE j.id = %(job_id)s AND j.attempt = %(attempt)s AND j.session_id = %(session_id)s
  AND j.status = 'running'
  AND EXISTS (SELECT 1 FROM plunder_sessions
              WHERE id = %(session_id)s
                AND expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp()))
FOR SHARE OF j;

-- name: job_cancel
UPDATE plunder_jobs
SET status = 'cancelled',
    finished_at = COALESCE(%(now)s::timestamptz, statement_timestamp()),
    deadline_at = NULL
WHERE id = %(job_id)s AND status IN ('pending', 'running', 'waiting')
RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
          backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
          finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
          retry_on_lost, expires_at, limit_key, affinity, require, cost;

-- name: job_retry
-- By a person or the API: one more attempt for a job that ended without success. Without
-- a start-by deadline: an expired job retried runs whenever a worker takes it.
UPDATE plunder_jobs
SET status = 'pending', finished_at = NULL,
    -- a limited job goes back held (see limit_admit)
    run_at = COALESCE(%(now)s::timestamptz, statement_timestamp())
        + (limit_key IS NOT NULL)::int * interval '200000000000 seconds',
    started_at = NULL, session_id = NULL, result = NULL, error = NULL,
    expires_at = NULL, max_attempts = GREATEST(max_attempts, attempt + 1)
WHERE id = %(job_id)s AND status IN ('failed', 'timed_out', 'cancelled', 'expired')
RETURNING id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
          backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
          finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
          retry_on_lost, expires_at, limit_key, affinity, require, cost;

-- name: job_list
-- Newest first, keyset-paginated by id (after is the last id of the previous page).
-- A partitioned queue's jobs are in its partitions' queues ("q~3", migration 14) too.
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s
       OR left(queue, length(%(queue)s) + 1) = %(queue)s || '~')
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(after)s::bigint IS NULL OR id < %(after)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_runs
-- The history rows of the runs that ended other than in success, and the job's current
-- attempt when it runs or succeeded (migration 0006): that run is on the job, its worker
-- from the job (written by the claim; from its session, for an attempt an earlier plunder
-- claimed). A row an earlier plunder opened for that attempt (outcome still NULL) is the
-- same run: the job's record of it wins.
SELECT job_id, attempt, session_id, worker, host, pid, started_at, finished_at, outcome,
       error, logs
FROM plunder_runs AS r
WHERE r.job_id = %(job_id)s
  AND (r.outcome IS NOT NULL OR NOT EXISTS (
      SELECT 1 FROM plunder_jobs AS j
      WHERE j.id = r.job_id AND j.attempt = r.attempt AND j.status IN ('running', 'succeeded')))
UNION ALL
SELECT j.id, j.attempt, j.session_id, COALESCE(j.run_worker, s.name, ''),
       COALESCE(j.run_host, s.host, ''), COALESCE(j.run_pid, s.pid, 0), j.started_at,
       CASE WHEN j.status = 'succeeded' THEN j.finished_at END,
       CASE WHEN j.status = 'succeeded' THEN 'succeeded' END,
       NULL, COALESCE(j.run_logs, '[]')
FROM plunder_jobs AS j
LEFT JOIN plunder_sessions AS s ON s.id = j.session_id
WHERE j.id = %(job_id)s AND j.status IN ('running', 'succeeded') AND j.started_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM plunder_runs AS r
                  WHERE r.job_id = j.id AND r.attempt = j.attempt AND r.outcome IS NOT NULL)
ORDER BY attempt;

-- name: event_append
-- batch. Called after job_check_claim in the same transaction.
INSERT INTO plunder_events (job_id, attempt, kind, data, created_at)
SELECT u.job_id, u.attempt, u.kind, u.data,
       COALESCE(%(now)s::timestamptz, statement_timestamp())
FROM unnest(%(job_id)s::bigint[], %(attempt)s::int[], %(kind)s::text[], %(data)s::text[])
         WITH ORDINALITY AS u(job_id, attempt, kind, data, ord)
ORDER BY u.ord
RETURNING id;

-- name: event_list
SELECT * FROM plunder_events
WHERE job_id = %(job_id)s AND id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: session_insert
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
-- Its free slots count for claims for 2 s (or its expiry, if shorter): see session_heartbeat.
INSERT INTO plunder_sessions (id, name, host, pid, queues, expiry, started_at, heartbeat_at,
                              expires_at, tasks, free_slots, key_id, labels, free_until,
                              slots)
SELECT %(session_id)s, %(name)s, %(host)s, %(pid)s, %(queues)s::text[], %(expiry)s,
       clock.now, clock.now, clock.now + %(expiry)s * interval '1 second',
       %(tasks)s::text[], %(free_slots)s::integer, %(key_id)s::text, %(labels)s::text[],
       clock.now + LEAST(%(expiry)s, 2.0) * interval '1 second', %(slots)s::integer
FROM clock
RETURNING *;

-- name: session_heartbeat
-- A session past its expiry is dead even before the janitor reaps it: it cannot come back.
-- Its free slots as the worker counts them now (NULL: unchanged), which a claim counts
-- for 2 s (or its expiry, if shorter; see migration 22), and its labels (NULL: unchanged).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_sessions AS s
SET heartbeat_at = clock.now, expires_at = clock.now + s.expiry * interval '1 second',
    free_slots = COALESCE(%(free_slots)s::integer, s.free_slots),
    free_until = CASE WHEN %(free_slots)s::integer IS NULL THEN s.free_until
                 ELSE clock.now + LEAST(s.expiry, 2.0) * interval '1 second' END,
    labels = COALESCE(%(labels)s::text[], s.labels)
FROM clock
WHERE s.id = %(session_id)s AND s.expires_at > clock.now
RETURNING s.*;

-- name: session_queues
-- A live session joins :add (after the queues it has, in order) and leaves :remove, in one
-- statement: set union and difference on the row as it is when the update takes its lock,
-- so two changes at once both count (the second re-reads the row the first wrote).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_sessions AS s
SET queues = ARRAY(
    SELECT u.q FROM unnest(s.queues || %(add)s::text[]) WITH ORDINALITY AS u(q, n)
    WHERE u.q <> ALL(%(remove)s::text[])
    GROUP BY u.q ORDER BY min(u.n))
FROM clock
WHERE s.id = %(session_id)s AND s.expires_at > clock.now
RETURNING s.*;

-- name: task_publish
-- batch. The options of a task a worker serves, written in the transaction that opens its
-- session: the last worker to open a session decides a task's options. A batch names each
-- task once (an upsert may not write one row twice).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_tasks (name, queue, pool, options, session_id, published_at)
SELECT u.name, u.queue, u.pool, u.options, %(session_id)s, clock.now
FROM unnest(%(name)s::text[], %(queue)s::text[], %(pool)s::text[], %(options)s::text[])
         WITH ORDINALITY AS u(name, queue, pool, options, n),
     clock
ORDER BY u.n
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, pool = excluded.pool, options = excluded.options,
    session_id = excluded.session_id, published_at = excluded.published_at;

-- name: task_get
SELECT name, queue, pool, options, session_id, published_at FROM plunder_tasks
WHERE name = %(name)s;

-- name: task_list
SELECT name, queue, pool, options, session_id, published_at FROM plunder_tasks ORDER BY name;

-- name: session_delete
DELETE FROM plunder_sessions WHERE id = %(session_id)s RETURNING id;

-- name: session_list
SELECT * FROM plunder_sessions
WHERE expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp())
ORDER BY started_at, id;

-- name: session_expired
-- Expired sessions, the earliest first, locked for session_delete_many in this transaction.
-- A row another transaction holds is skipped, not waited for: a worker stopped in the
-- middle of a heartbeat holds its session row until the server ends its idle transaction,
-- and a janitor waiting for it would hold one of its worker's pooled connections, which
-- that worker's claims need. The next pass sees it again.
SELECT id FROM plunder_sessions
WHERE expires_at <= COALESCE(%(now)s::timestamptz, statement_timestamp())
ORDER BY expires_at LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: session_delete_many
DELETE FROM plunder_sessions
WHERE id = ANY(%(session_ids)s::text[])
  AND expires_at <= COALESCE(%(now)s::timestamptz, statement_timestamp())
RETURNING id;

-- name: job_running_of_session
SELECT id, attempt, session_id, status FROM plunder_jobs
WHERE session_id = %(session_id)s AND status = 'running';

-- name: job_lose_many
-- The running jobs of dead sessions, and of sessions that no longer exist (a claim that
-- committed after its session was reaped): back to pending at once while attempts remain
-- (the attempt that was lost counts) and the job's retry_on_lost allows, otherwise
-- timed_out. A rescued job keeps its place in the claim order (its run_at), so a backlog
-- cannot starve it, and counts the loss (a suspect after enough of them, see
-- job_claim_many). One not retried by its policy records plunder.WorkerLost, naming the
-- session (its JSON as payload.encode writes it), not error.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = CASE WHEN j.retry_on_lost AND j.attempt < j.max_attempts THEN 'pending'
                  ELSE 'timed_out' END,
    -- a limited job goes back held (see limit_admit)
    run_at = LEAST(j.run_at, clock.now) + (j.limit_key IS NOT NULL AND j.retry_on_lost
        AND j.attempt < j.max_attempts)::int * interval '200000000000 seconds',
    finished_at = CASE WHEN j.retry_on_lost AND j.attempt < j.max_attempts THEN NULL
                       ELSE clock.now END,
    error = CASE WHEN j.retry_on_lost THEN %(error)s
                 ELSE '{"type":"plunder.WorkerLost","message":' || to_json(
                     'the worker''s session ' || j.session_id || ' expired while this '
                     || 'attempt was running; not run again (retry_on_lost=False)')::text
                     || ',"traceback":""}' END,
    deadline_at = NULL,
    failed_sessions = array_append(j.failed_sessions, j.session_id),
    losses = j.losses + 1,
    session_id = CASE WHEN j.retry_on_lost AND j.attempt < j.max_attempts THEN NULL
                      ELSE j.session_id END
FROM clock
WHERE j.status = 'running'
  AND (j.session_id = ANY(%(session_ids)s::text[])
       OR NOT EXISTS (SELECT 1 FROM plunder_sessions AS s WHERE s.id = j.session_id))
-- the lost session: the one just appended to failed_sessions
RETURNING j.id, j.attempt, j.status, j.queue,
          j.failed_sessions[cardinality(j.failed_sessions)] AS session_id, j.error;

-- name: job_timeout_due
-- Running jobs past their deadline, and the session running each (job_timeout_many may
-- take it off the job; the timed-out run's history row names it). Rows a worker is
-- completing right now are skipped; the next pass sees them again if they still run. The
-- rows found stay locked for job_timeout_many, in the same transaction.
SELECT j.id, j.attempt, j.session_id FROM plunder_jobs AS j
WHERE j.status = 'running'
  AND j.deadline_at <= COALESCE(%(now)s::timestamptz, statement_timestamp())
ORDER BY j.deadline_at LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED;

-- name: job_timeout_many
-- The jobs job_timeout_due found (and locked), in the same transaction: retried at once
-- when the job allows it and attempts remain, otherwise timed_out.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = CASE WHEN j.retry_on_timeout AND j.attempt < j.max_attempts THEN 'pending'
                  ELSE 'timed_out' END,
    -- a limited job goes back held (see limit_admit)
    run_at = clock.now + (j.limit_key IS NOT NULL AND j.retry_on_timeout
        AND j.attempt < j.max_attempts)::int * interval '200000000000 seconds',
    finished_at = CASE WHEN j.retry_on_timeout AND j.attempt < j.max_attempts THEN NULL
                       ELSE clock.now END,
    error = %(error)s,
    deadline_at = NULL,
    session_id = CASE WHEN j.retry_on_timeout AND j.attempt < j.max_attempts THEN NULL
                      ELSE j.session_id END
FROM clock
WHERE j.id = ANY(%(job_ids)s::bigint[]) AND j.status = 'running'
RETURNING j.id, j.attempt, j.status, j.queue;

-- name: job_expire_many
-- Pending jobs past their start-by deadline end expired, at most limit a pass, the
-- earliest deadlines first (plunder_jobs_expires holds only pending jobs that have one);
-- rows a claim holds are skipped (its walk steps over expired jobs, so it holds one only
-- if it was still in time by the claim's clock). They never ran: no session, no history
-- row.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
due AS (
    SELECT j.id FROM plunder_jobs AS j, clock
    WHERE j.status = 'pending' AND j.expires_at IS NOT NULL AND j.expires_at <= clock.now
    ORDER BY j.expires_at LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE plunder_jobs AS j
SET status = 'expired', finished_at = clock.now, error = %(error)s
FROM clock, due
WHERE j.id = due.id AND j.status = 'pending'
RETURNING j.id, j.attempt, j.status, j.queue;

-- name: job_prune_find
-- Finished jobs past retention, the oldest ids first: what job_prune_many then deletes.
-- A read of its own, so that nothing waits while it scans (with nothing to prune, the whole
-- table).
SELECT j.id FROM plunder_jobs AS j
WHERE j.status IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'expired', 'skipped')
  AND j.finished_at < COALESCE(%(now)s::timestamptz, statement_timestamp())
                      - %(older_than)s * interval '1 second'
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_prune_many
-- Deletes the jobs job_prune_find found that are still finished past retention, with
-- their runs and events.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
gone AS (
    DELETE FROM plunder_jobs AS j
    USING clock
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.status IN ('succeeded', 'failed', 'timed_out', 'cancelled', 'expired', 'skipped')
      AND j.finished_at < clock.now - %(older_than)s * interval '1 second'
    RETURNING j.id
),
runs AS (DELETE FROM plunder_runs WHERE job_id IN (SELECT id FROM gone)),
events AS (DELETE FROM plunder_events WHERE job_id IN (SELECT id FROM gone))
SELECT id FROM gone;

-- name: lease_check
-- The fence for janitor writes: the caller still holds the lease under this term. FOR
-- SHARE makes a takeover wait until this transaction ends.
SELECT term FROM plunder_leases
WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s
  AND expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp())
FOR SHARE;

-- name: lease_acquire
-- Take a free or expired lease (the term grows), or renew our own live one (same term).
-- A lease row locked by a pass in progress (lease_check's FOR SHARE) is not waited for:
-- nothing is taken now, the next try sees it again. A holder stopped in the middle of a
-- pass keeps that lock until the server ends its idle transaction (the lease's ttl), and
-- a worker trying for the lease would wait all that time on one of the few pooled
-- connections its claims need (`free` locks the row first, so the upsert never waits).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
free AS (SELECT name FROM plunder_leases WHERE name = %(name)s FOR UPDATE SKIP LOCKED)
INSERT INTO plunder_leases (name, holder, term, acquired_at, expires_at)
SELECT %(name)s, %(holder)s, 1, clock.now, clock.now + %(ttl)s * interval '1 second'
FROM clock
WHERE EXISTS (SELECT FROM free)
   OR NOT EXISTS (SELECT FROM plunder_leases WHERE name = %(name)s)
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
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_leases AS l
SET expires_at = clock.now + %(ttl)s * interval '1 second'
FROM clock
WHERE l.name = %(name)s AND l.holder = %(holder)s AND l.term = %(term)s
  AND l.expires_at > clock.now
RETURNING l.*;

-- name: lease_release
-- The row stays, so that the next holder's term is still larger.
UPDATE plunder_leases
SET expires_at = COALESCE(%(now)s::timestamptz, statement_timestamp())
WHERE name = %(name)s AND holder = %(holder)s AND term = %(term)s
RETURNING *;

-- name: lease_get
SELECT * FROM plunder_leases WHERE name = %(name)s;

-- name: queue_counts
SELECT queue, status, count(*) AS n FROM plunder_jobs GROUP BY queue, status;

-- name: job_unrunnable
-- Pending jobs that no live session can run, counted by task and queue: no live session
-- lists both their queue and their task. A read for people, as queue_counts. A
-- partition's queue ("q~3", migration 14) counts as its queue. Jobs that require labels
-- (migration 22) count apart: they also need a session holding those labels; so do jobs
-- of several slots (migration 23): they need a session with as many in all.
SELECT p.task, p.queue, p.require, p.cost, p.n FROM (
    SELECT task, split_part(queue, '~', 1) AS queue, require, cost, count(*) AS n
    FROM plunder_jobs WHERE status = 'pending' GROUP BY 1, 2, 3, 4
) AS p
WHERE NOT EXISTS (
    SELECT 1 FROM plunder_sessions AS s
    WHERE s.expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp())
      AND p.queue = ANY(s.queues) AND p.task = ANY(s.tasks)
      AND (p.require IS NULL OR p.require::text[] <@ s.labels)
      AND p.cost <= s.slots)
ORDER BY p.task, p.queue, p.require NULLS FIRST, p.cost;

-- name: queue_oldest_pending
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT j.queue, extract(epoch FROM clock.now - min(j.run_at))::float8 AS age
FROM plunder_jobs AS j, clock
WHERE j.status = 'pending' AND j.run_at <= clock.now
GROUP BY j.queue, clock.now;

-- name: notify
-- Wakes listeners when this transaction commits (never before, never if it rolls back).
-- Channels are fixed names; queue names and job ids travel in the payload, never in the
-- channel name. Payloads stay under PostgreSQL's 8000-byte limit (the store chunks them).
-- Only while a listening connection names the channel in plunder_listeners (listener_set):
-- PostgreSQL serializes the commits of notifying transactions, each holding a database-wide
-- lock until its WAL is flushed, so a notification nobody hears is not free. The expiry is
-- by the real clock of the database, never a `now` a caller passed. Every statement that
-- notifies checks this way.
SELECT pg_notify(%(channel)s, %(payload)s)
WHERE EXISTS (SELECT 1 FROM plunder_listeners AS l
              WHERE %(channel)s = ANY(l.channels) AND l.expires_at > statement_timestamp());

-- name: listener_set
-- A listening connection names its channels for %(ttl)s seconds, before it LISTENs on a new
-- one and again while it lives; rows that expired (their connection gone without a word)
-- are removed on the way.
WITH expired AS (
    DELETE FROM plunder_listeners
    WHERE expires_at < statement_timestamp() AND id <> %(id)s
)
INSERT INTO plunder_listeners (id, channels, expires_at)
VALUES (%(id)s, %(channels)s::text[],
        statement_timestamp() + %(ttl)s::float8 * interval '1 second')
ON CONFLICT (id) DO UPDATE SET channels = EXCLUDED.channels, expires_at = EXCLUDED.expires_at;

-- name: listener_drop
-- A listening connection that listens on nothing any more, or closes.
DELETE FROM plunder_listeners WHERE id = %(id)s;

-- name: job_next_due
-- Seconds (by the database clock) until the earliest pending job this worker could run is
-- due (zero or less: due now), so it can sleep until then instead of ticking. Read as a
-- claim reads: each queue on its own, one priority level at a time (`levels`), and in
-- each level the earliest job of a task the worker runs, one probe (a level's pending jobs
-- are in run_at order in plunder_jobs_claim; jobs of other tasks before it are stepped
-- over). So what it reads does not grow with other queues' jobs, nor with the jobs due
-- later behind the first of each level. Below the last of the `levels` levels, the rest
-- of the queue is read in one go (all of it: a minimum cannot stop early). A job past its
-- start-by deadline is no work (the claim steps over it): not read as due.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT extract(epoch FROM min(d.run_at) - min(clock.now))::float8 AS due_in
FROM clock, unnest(%(queues)s::text[]) AS q(name)
CROSS JOIN LATERAL (
    WITH RECURSIVE /* include: job_claim_levels */
    SELECT first.run_at FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT j.run_at FROM plunder_jobs AS j
        WHERE j.status = 'pending' AND j.queue = q.name AND j.priority = l.priority
          AND j.task = ANY(%(tasks)s::text[])
          -- spelled out, not IS NOT FALSE: the planner then counts the many jobs with no
          -- deadline, and walks the level in index order instead of sorting all of it
          AND (j.expires_at IS NULL OR j.expires_at > clock.now)
        ORDER BY j.run_at, j.id
        LIMIT 1) AS first
    UNION ALL
    SELECT min(j.run_at) FROM (SELECT min(priority) AS below FROM levels
                               HAVING count(*) = %(levels)s::int) AS b
    JOIN plunder_jobs AS j
      ON j.status = 'pending' AND j.queue = q.name AND j.priority < b.below
         AND j.task = ANY(%(tasks)s::text[]) AND (j.expires_at IS NULL OR j.expires_at > clock.now)
) AS d;

-- name: job_table_pages
-- How many pages plunder_jobs has now (`pages`) and had when its statistics were last
-- taken (`seen`: ANALYZE or VACUUM). A connection keeps the plan it made for a prepared
-- statement (its generic plan), made for the size the table had then: one made while the
-- table was nearly empty reads the whole table where an index would find the rows, and
-- a worker that waited on an empty queue before a burst then drained it at a sixth of
-- its speed. New statistics make every connection plan its statements anew. Also the rows
-- the statistics counted (`counted`: none is -1) and the live rows the server counts now
-- (`live`, as each connection reports them, a second or so after its transactions): a
-- VACUUM of a table emptied but for its last rows keeps its pages and counts almost no
-- rows, and a table refilled within those pages never looks as if it had grown.
SELECT c.relpages::bigint AS seen,
       pg_relation_size(c.oid) / current_setting('block_size')::bigint AS pages,
       GREATEST(c.reltuples, 0)::bigint AS counted,
       COALESCE(s.n_live_tup, 0)::bigint AS live,
       -- the dead row versions left since its last VACUUM (see job_table_vacuum)
       COALESCE(s.n_dead_tup, 0)::bigint AS dead
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = 'plunder_jobs'::regclass;

-- name: job_table_analyze
-- New statistics for plunder_jobs (see job_table_pages); skipped, not waited for, while
-- another ANALYZE or a VACUUM holds the table. Its size (what the plans got wrong) and the
-- columns that claims and the partial indexes choose by, a few times cheaper than every
-- column (docs/decisions/0006-statistics-and-plans.md; autovacuum analyzes them all).
ANALYZE (SKIP_LOCKED) plunder_jobs (queue, priority, status);

-- name: job_table_vacuum
-- The dead row versions of plunder_jobs removed, with their index entries (sent alone:
-- VACUUM runs outside any transaction). A claim reads a queue's pending jobs from the head
-- of plunder_jobs_claim, and each job claimed since the last VACUUM leaves a dead entry
-- there: a drain of 200,000 jobs left 1,200 pages that every claim read (7 ms each) until
-- autovacuum came, which on a table of many finished jobs waits for a fifth of them to be
-- dead (docs/decisions/0027-vacuum-the-claim-index.md). INDEX_CLEANUP ON: the dead entries
-- go even where few heap pages have any (VACUUM may skip the indexes then); TRUNCATE OFF:
-- no exclusive lock for giving back the table's empty tail (autovacuum still does);
-- SKIP_LOCKED: not waited for while another VACUUM or ANALYZE runs on it.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE OFF) plunder_jobs;

-- name: session_get
SELECT * FROM plunder_sessions WHERE id = %(session_id)s;

-- name: session_end_for_key
-- The live sessions a key opened, ended now (a revoked key): the janitor then treats them
-- as any expired session, their running jobs lost.
UPDATE plunder_sessions
SET expires_at = COALESCE(%(now)s::timestamptz, statement_timestamp())
WHERE key_id = %(key_id)s AND expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp())
RETURNING id;

-- name: key_insert
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_keys (id, name, role, key_group, queues, secret_hash, created_at,
                          expires_at)
SELECT %(key_id)s, %(name)s, %(role)s, %(key_group)s, %(queues)s::text[], %(secret_hash)s,
       clock.now, clock.now + %(expires_in)s::float8 * interval '1 second'
FROM clock
RETURNING *;

-- name: key_get
SELECT * FROM plunder_keys WHERE id = %(key_id)s;

-- name: key_list
SELECT * FROM plunder_keys ORDER BY created_at, id;

-- name: key_revoke
-- Revoked once: a second revoke keeps the first time.
UPDATE plunder_keys
SET revoked_at = COALESCE(revoked_at, %(now)s::timestamptz, statement_timestamp())
WHERE id = %(key_id)s
RETURNING *;

-- name: queue_group_take
-- The queues a key of a group names become that group's, unless another group has them.
INSERT INTO plunder_queue_groups (queue, group_name)
SELECT q, %(group_name)s FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO NOTHING;

-- name: queue_group_list
SELECT queue, group_name FROM plunder_queue_groups ORDER BY queue;

-- name: limit_declare
-- batch. The limits a batch of jobs names, each made as its task declares it when it is
-- new (its rate's bucket full); one that exists keeps what it holds (limit_set changes it).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_limits (key, ceiling, rate_count, rate_period, tokens, refilled_at)
SELECT u.key, u.ceiling, u.rate_count, u.rate_period, COALESCE(u.rate_count, 0), clock.now
FROM unnest(%(key)s::text[], %(ceiling)s::int[], %(rate_count)s::int[],
            %(rate_period)s::float8[]) AS u(key, ceiling, rate_count, rate_period), clock
ORDER BY u.key
ON CONFLICT (key) DO NOTHING;

-- name: limit_set
-- A limit as a person or the API sets it: its ceiling and rate replaced.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_limits (key, ceiling, rate_count, rate_period, tokens, refilled_at)
SELECT %(key)s, %(ceiling)s::int, %(rate_count)s::int, %(rate_period)s::float8,
       COALESCE(%(rate_count)s::int, 0), clock.now
FROM clock
ON CONFLICT (key) DO UPDATE
SET ceiling = excluded.ceiling, rate_count = excluded.rate_count,
    rate_period = excluded.rate_period,
    -- a rate new to the key starts with a full bucket, as a new limit does
    tokens = CASE WHEN plunder_limits.rate_count IS NULL THEN COALESCE(excluded.rate_count, 0)
                  ELSE LEAST(plunder_limits.tokens, COALESCE(excluded.rate_count, 0)) END;

-- name: limit_lock
-- The first step of an admission (plunder.store.limits): the key's row, locked until the
-- transaction ends (admissions of one key take turns; an UPDATE, so that one at REPEATABLE
-- READ after another's commit fails and is run again), its rate's bucket refilled.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_limits AS l
SET tokens = CASE WHEN l.rate_count IS NULL THEN 0 ELSE LEAST(l.rate_count::float8,
        l.tokens + GREATEST(extract(epoch FROM clock.now - l.refilled_at), 0)::float8
                   * l.rate_count / l.rate_period) END,
    refilled_at = clock.now
FROM clock
WHERE l.key = %(key)s
RETURNING l.key, l.ceiling, l.rate_count, l.tokens,
          COALESCE(l.paused_until > clock.now, false) AS paused;

-- name: limit_busy
-- The key's jobs that run or are admitted (pending, not held): what its ceiling bounds.
SELECT count(*) AS n FROM plunder_jobs
WHERE limit_key = %(key)s AND status IN ('pending', 'running')
  AND run_at < '4000-01-01'::timestamptz;

-- name: limit_admit
-- Up to n of the key's held jobs that are due, the first due first, admitted: back to their
-- due time, where a claim takes them in their place. Rows a claim or another admission
-- holds are skipped.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET run_at = j.run_at - interval '200000000000 seconds'
WHERE j.id = ANY(ARRAY(
    SELECT h.id FROM plunder_jobs AS h, clock
    WHERE h.limit_key = %(key)s AND h.status = 'pending'
      AND h.run_at >= '4000-01-01'::timestamptz
      AND h.run_at <= clock.now + interval '200000000000 seconds'
    ORDER BY h.run_at, h.id
    LIMIT %(n)s
    FOR UPDATE OF h SKIP LOCKED))
RETURNING j.id, j.queue;

-- name: limit_spend
-- The rate's tokens an admission used (after limit_lock, in its transaction).
UPDATE plunder_limits SET tokens = tokens - %(n)s WHERE key = %(key)s;

-- name: limit_hold
-- The key's admitted jobs that no claim took yet, held again (a pause).
UPDATE plunder_jobs SET run_at = run_at + interval '200000000000 seconds'
WHERE limit_key = %(key)s AND status = 'pending' AND run_at < '4000-01-01'::timestamptz
RETURNING id;

-- name: limit_pause
-- No admission of the key for %(seconds)s seconds; a pause that ends later stays.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
INSERT INTO plunder_limits (key, tokens, refilled_at, paused_until)
SELECT %(key)s, 0, clock.now, clock.now + %(seconds)s::float8 * interval '1 second'
FROM clock
ON CONFLICT (key) DO UPDATE
SET paused_until = GREATEST(plunder_limits.paused_until, excluded.paused_until)
RETURNING paused_until;

-- name: limit_resume
UPDATE plunder_limits SET paused_until = NULL WHERE key = %(key)s RETURNING key;

-- name: limit_due
-- The keys that are not paused and have held jobs that are due: the janitor's admissions.
-- One probe of plunder_jobs_limited per limit.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT l.key FROM plunder_limits AS l, clock
WHERE (l.paused_until IS NULL OR l.paused_until <= clock.now)
  AND EXISTS (SELECT FROM plunder_jobs AS j
              WHERE j.limit_key = l.key AND j.status = 'pending'
                AND j.run_at >= '4000-01-01'::timestamptz
                AND j.run_at <= clock.now + interval '200000000000 seconds')
ORDER BY l.key;

-- name: limit_list
-- Every limit with its jobs running, admitted (pending, not held) and held; a pause that
-- has ended reads NULL. A read for people, as queue_counts.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT l.key, l.ceiling, l.rate_count, l.rate_period,
       CASE WHEN l.paused_until > clock.now THEN l.paused_until END AS paused_until,
       count(*) FILTER (WHERE j.status = 'running') AS running,
       count(*) FILTER (WHERE j.status = 'pending' AND j.run_at < '4000-01-01'::timestamptz)
           AS admitted,
       count(*) FILTER (WHERE j.status = 'pending' AND j.run_at >= '4000-01-01'::timestamptz)
           AS held
FROM plunder_limits AS l CROSS JOIN clock
LEFT JOIN plunder_jobs AS j
  ON j.limit_key = l.key AND j.status IN ('pending', 'running')
GROUP BY l.key, l.ceiling, l.rate_count, l.rate_period, l.paused_until, clock.now
ORDER BY l.key;
-- name: partition_declare
-- A queue's partitions (migration 14), declared anew: a changed count makes a new
-- generation (the janitor assigns the partitions again).
INSERT INTO plunder_partitions (queue, partitions) VALUES (%(queue)s, %(partitions)s)
ON CONFLICT (queue) DO UPDATE
SET partitions = excluded.partitions, generation = plunder_partitions.generation + 1
WHERE plunder_partitions.partitions <> excluded.partitions;

-- name: partition_list
SELECT queue, partitions, generation FROM plunder_partitions ORDER BY queue;

-- name: partition_owner_list
SELECT queue, partition, session_id FROM plunder_partition_owners ORDER BY queue, partition;

-- name: partition_members
-- The live sessions, with their queues: those that may own partitions.
SELECT id, queues FROM plunder_sessions
WHERE expires_at > COALESCE(%(now)s::timestamptz, statement_timestamp())
ORDER BY id;

-- name: partition_owners_clear
-- A queue's assignment, before it is written anew (partition_owners_set).
DELETE FROM plunder_partition_owners WHERE queue = %(queue)s;

-- name: partition_owners_set
-- %(owners)s names the owner of each partition of the queue, in order.
INSERT INTO plunder_partition_owners (queue, partition, session_id)
SELECT %(queue)s, (u.n - 1)::integer, u.session_id
FROM unnest(%(owners)s::text[]) WITH ORDINALITY AS u(session_id, n);

-- name: partition_generation_next
-- A queue's assignment changed: its generation grows by one.
UPDATE plunder_partitions SET generation = generation + 1 WHERE queue = %(queue)s
RETURNING generation;

-- name: partition_owned
-- For a session's heartbeat: every partitioned queue, its generation, and each partition
-- of it the session owns (NULL: none).
SELECT p.queue, p.partitions, p.generation, o.partition
FROM plunder_partitions AS p
LEFT JOIN plunder_partition_owners AS o ON o.queue = p.queue AND o.session_id = %(session_id)s
ORDER BY p.queue, o.partition;

-- name: fair_declare
-- A fair queue (migration 21), declared anew with its weights (a JSON object).
INSERT INTO plunder_fair_queues (queue, weights) VALUES (%(queue)s, %(weights)s::jsonb)
ON CONFLICT (queue) DO UPDATE SET weights = excluded.weights;

-- name: fair_backfill
-- A queue made fair: its pending jobs without a group join the group "default".
UPDATE plunder_jobs SET group_name = 'default'
WHERE queue = %(queue)s AND status = 'pending' AND group_name IS NULL;

-- name: fair_queue_list
SELECT queue, weights::text AS weights FROM plunder_fair_queues ORDER BY queue;

-- name: fair_group_touch
-- batch. A group with jobs just enqueued, made where new at the lowest virtual time of its
-- queue: served within the current round.
INSERT INTO plunder_fair_groups (queue, group_name, vtime)
SELECT u.queue, u.group_name,
       coalesce((SELECT min(g.vtime) FROM plunder_fair_groups AS g WHERE g.queue = u.queue), 0)
FROM unnest(%(queue)s::text[], %(group)s::text[]) AS u(queue, group_name)
ON CONFLICT (queue, group_name) DO NOTHING;

-- name: fair_turn
-- The next %(groups)s groups of the fair queues %(queues)s in turn (lowest virtual time
-- first), each with its weight and the highest virtual time of its queue.
SELECT g.queue, g.group_name, g.vtime,
       coalesce((SELECT (f.weights ->> g.group_name)::float8 FROM plunder_fair_queues AS f
                 WHERE f.queue = g.queue), 1.0) AS weight,
       (SELECT max(m.vtime) FROM plunder_fair_groups AS m WHERE m.queue = g.queue) AS top
FROM plunder_fair_groups AS g
WHERE g.queue = ANY(%(queues)s::text[])
ORDER BY g.vtime, g.queue, g.group_name
LIMIT %(groups)s;

-- name: fair_walk
-- Up to %(limit)s jobs of one group of a fair queue that a claim may take now, in claim
-- order (higher priority first, then oldest due), locked (rows another claimer holds are
-- skipped): a range of plunder_jobs_fair, which never reads the other groups' jobs (its
-- own due later, of a higher priority than those due now, are stepped over). Filters as
-- job_claim_many — labels preferred and required, no more slots than this session has
-- (migrations 22, 23) — but for the jobs this session failed (taken again).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
-- the labelled sessions of this queue with a free slot reported lately, and this one
h AS (SELECT s.labels, s.tasks, s.free_slots FROM plunder_sessions AS s, clock
      WHERE s.free_until > clock.now
      AND s.free_slots > 0 AND s.labels <> '{}' AND %(queue)s = ANY(s.queues)),
m AS (SELECT labels, slots FROM plunder_sessions WHERE id = %(session_id)s)
SELECT j.id, j.losses, j.priority, j.run_at, j.cost FROM plunder_jobs AS j, clock
WHERE j.status = 'pending'
  AND j.group_name IS NOT NULL
  AND j.queue = %(queue)s
  AND j.group_name = %(group)s
  AND j.run_at <= clock.now
  -- after the last job this claim walked of the group, in claim order (NULL: from its first)
  AND (%(after_id)s::bigint IS NULL
       OR (-j.priority, j.run_at, j.id)
          > (-%(after_priority)s::int, %(after_run_at)s::timestamptz, %(after_id)s::bigint))
  -- not past its start-by deadline (NULL: none)
  AND (j.expires_at IS NULL OR j.expires_at > clock.now)
  AND j.task = ANY(%(tasks)s::text[])
  AND (j.losses < %(suspect_losses)s OR %(take_suspect)s)
  AND (j.affinity IS NULL OR j.affinity::text[] <@ (SELECT labels FROM m)
       OR NOT EXISTS (SELECT FROM h WHERE j.task = ANY(h.tasks) AND h.free_slots >= j.cost
                      AND j.affinity::text[] || j.require::text[] <@ h.labels))
  AND (j.require IS NULL OR j.require::text[] <@ (SELECT labels FROM m))
  AND (j.cost = 1 OR j.cost <= (SELECT slots FROM m))
-- -priority: the order of plunder_jobs_fair alone (migration 23)
ORDER BY -j.priority, j.run_at, j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED;

-- name: fair_claim
-- Claim the pending jobs %(ids)s (chosen and locked by fair_walk in this transaction) for a
-- live session, as job_claim_many claims those it picks.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
UPDATE plunder_jobs AS j
SET status = 'running',
    attempt = j.attempt + 1,
    session_id = %(session_id)s,
    started_at = clock.now,
    finished_at = NULL,
    deadline_at = clock.now + j.timeout * interval '1 second',
    run_worker = me.name, run_host = me.host, run_pid = me.pid
FROM clock,
     (SELECT name, host, pid FROM plunder_sessions
      WHERE id = %(session_id)s AND expires_at > COALESCE(%(now)s::timestamptz,
                                                         statement_timestamp())) AS me
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.status = 'pending'
  AND (j.expires_at IS NULL OR j.expires_at > clock.now)
RETURNING j.id, j.queue, j.task, j.args, j.kwargs, j.priority, j.status, j.attempt,
          j.max_attempts, j.timeout, j.backoff_base, j.backoff_cap, j.retry_on_timeout, j.key,
          j.run_at, j.created_at, j.started_at, j.finished_at, j.deadline_at, j.session_id,
          j.result, j.error, j.failed_sessions, j.losses, j.retry_on_lost, j.expires_at,
          j.limit_key, j.affinity, j.require, j.cost;

-- name: fair_advance
-- batch. A group's turn taken: its virtual time moves on by delta (slots taken / weight),
-- and to floor at least (a group with no job due: behind every other; NULL: no floor).
UPDATE plunder_fair_groups AS g
SET vtime = GREATEST(g.vtime + u.delta, u.floor)
FROM unnest(%(queue)s::text[], %(group)s::text[], %(delta)s::float8[], %(floor)s::float8[])
         AS u(queue, group_name, delta, floor)
WHERE g.queue = u.queue AND g.group_name = u.group_name;

-- name: fair_prune
-- The janitor's pass: groups with no pending job, and those of queues no longer fair, go.
DELETE FROM plunder_fair_groups AS g
WHERE NOT EXISTS (SELECT FROM plunder_jobs AS j
                  WHERE j.status = 'pending' AND j.group_name IS NOT NULL
                    AND j.queue = g.queue AND j.group_name = g.group_name)
   OR NOT EXISTS (SELECT FROM plunder_fair_queues AS f WHERE f.queue = g.queue)
RETURNING g.queue;

-- name: fair_repair
-- The janitor's pass: every group with pending jobs in the fair queue %(queue)s has its
-- row (one that went back to pending after its row was pruned: a retry, a rescue). The
-- groups are found one index probe each (a skip scan of plunder_jobs_fair).
WITH RECURSIVE seen(group_name) AS (
    SELECT (SELECT min(j.group_name) FROM plunder_jobs AS j
            WHERE j.status = 'pending' AND j.group_name IS NOT NULL
              AND j.queue = %(queue)s::text)
    UNION ALL
    SELECT (SELECT min(j.group_name) FROM plunder_jobs AS j
            WHERE j.status = 'pending' AND j.group_name IS NOT NULL
              AND j.queue = %(queue)s::text AND j.group_name > s.group_name)
    FROM seen AS s WHERE s.group_name IS NOT NULL
)
INSERT INTO plunder_fair_groups (queue, group_name, vtime)
SELECT %(queue)s::text, s.group_name,
       coalesce((SELECT min(g.vtime) FROM plunder_fair_groups AS g
                 WHERE g.queue = %(queue)s::text), 0)
FROM seen AS s WHERE s.group_name IS NOT NULL
ON CONFLICT (queue, group_name) DO NOTHING
RETURNING group_name;

-- name: fair_group_list
-- Each fair queue's groups in turn, with their weights.
SELECT g.queue, g.group_name, g.vtime,
       coalesce((SELECT (f.weights ->> g.group_name)::float8 FROM plunder_fair_queues AS f
                 WHERE f.queue = g.queue), 1.0) AS weight
FROM plunder_fair_groups AS g
ORDER BY g.queue, g.vtime, g.group_name;
-- Schedules (plunder.store.schedules; docs/guide/periodic.md) ----------------------------

-- name: schedule_lock
-- The schedule, locked for a change of it.
SELECT * FROM plunder_schedules WHERE name = %(name)s FOR UPDATE;

-- name: schedule_list
-- Every schedule, or the one named (NULL: every one).
SELECT * FROM plunder_schedules WHERE %(name)s::text IS NULL OR name = %(name)s
ORDER BY name;

-- name: schedule_insert
INSERT INTO plunder_schedules (name, task, queue, cron, timezone, args, kwargs, catch_up,
                               paused, next_at, created_at, updated_at)
VALUES (%(name)s, %(task)s, %(queue)s, %(cron)s, %(timezone)s, %(args)s, %(kwargs)s,
        %(catch_up)s, %(paused)s, %(next_at)s, %(now)s, %(now)s)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: schedule_update
-- A new definition; its pause, its last tick and (unless the ticks changed) its next one kept.
UPDATE plunder_schedules
SET task = %(task)s, queue = %(queue)s, cron = %(cron)s, timezone = %(timezone)s,
    args = %(args)s, kwargs = %(kwargs)s, catch_up = %(catch_up)s, next_at = %(next_at)s,
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING *;

-- name: schedule_pause
-- Paused or resumed; a resumed schedule's next tick is the first after the resume.
UPDATE plunder_schedules
SET paused = %(paused)s, next_at = COALESCE(%(next_at)s::timestamptz, next_at),
    updated_at = %(now)s
WHERE name = %(name)s
RETURNING *;

-- name: schedule_delete
DELETE FROM plunder_schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_due
-- The schedules with a tick due by now, the most overdue first, locked: a second enqueuer
-- waits here and then finds next_at moved.
SELECT * FROM plunder_schedules
WHERE NOT paused AND next_at <= %(now)s
ORDER BY next_at, name
LIMIT %(limit)s
FOR UPDATE;

-- name: schedule_advance
-- The compare-and-set that enqueues a schedule's ticks once: next_at moves past them only
-- from the value read in this transaction.
UPDATE plunder_schedules
SET next_at = %(next_at)s, last_at = COALESCE(%(last_at)s::timestamptz, last_at),
    last_job_id = COALESCE(%(last_job_id)s::bigint, last_job_id), updated_at = %(now)s
WHERE name = %(name)s AND next_at = %(was)s AND NOT paused
RETURNING name;
-- name: queue_pause
-- Pause a queue (migration 17): claims take none of its jobs; pausing a paused queue
-- changes nothing (no row returned).
INSERT INTO plunder_queue_pauses (queue, paused_at, reason)
VALUES (%(queue)s, COALESCE(%(now)s::timestamptz, statement_timestamp()), %(reason)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: queue_resume
DELETE FROM plunder_queue_pauses WHERE queue = %(queue)s RETURNING queue;

-- name: queue_pause_list
SELECT queue, paused_at, reason FROM plunder_queue_pauses ORDER BY queue;

-- name: observe_finished
-- Jobs that finished in the hour before now, by queue and minute (0: the last minute). A
-- read for people (the dashboard's sparklines): it walks the job table, so callers keep
-- its answer a few seconds.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT j.queue, floor(extract(epoch FROM clock.now - j.finished_at) / 60)::int AS ago,
       count(*) AS n
FROM plunder_jobs AS j, clock
WHERE j.finished_at > clock.now - interval '1 hour' AND j.finished_at <= clock.now
GROUP BY 1, 2;

-- name: observe_started
-- Jobs started in the hour before now, by queue and minute, with their mean wait from due
-- to started (seconds).
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT j.queue, floor(extract(epoch FROM clock.now - j.started_at) / 60)::int AS ago,
       count(*) AS n,
       avg(GREATEST(extract(epoch FROM j.started_at - j.run_at), 0))::float8 AS wait
FROM plunder_jobs AS j, clock
WHERE j.started_at > clock.now - interval '1 hour' AND j.started_at <= clock.now
GROUP BY 1, 2;

-- name: observe_lost
-- The sessions whose runs were lost in the hour before now (their worker died or its
-- session expired), with the jobs rescued from them: what the run history records of a
-- dead session once the janitor has reaped it.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT r.session_id, r.worker, r.host, r.pid, count(*) AS n,
       min(r.started_at) AS first_started, max(r.finished_at) AS lost_at,
       array_agg(r.job_id ORDER BY r.job_id) AS job_ids
FROM plunder_runs AS r, clock
WHERE r.outcome = 'lost' AND r.finished_at > clock.now - interval '1 hour'
GROUP BY r.session_id, r.worker, r.host, r.pid
ORDER BY lost_at DESC
LIMIT 100;

-- name: observe_jobs
-- Jobs newest first, keyset-paginated by id (before: the last id of the page before),
-- each filter NULL for none: a queue (its partitions too), task, status, key, created
-- from since to until (seconds since the epoch), and the queues a key may see (only:
-- only these; hide: none of these).
SELECT id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout,
       backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at,
       finished_at, deadline_at, session_id, result, error, failed_sessions, losses,
       retry_on_lost, expires_at, limit_key, affinity, require, cost
FROM plunder_jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s
       OR left(queue, length(%(queue)s) + 1) = %(queue)s || '~')
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(key)s::text IS NULL OR key = %(key)s)
  AND (%(since)s::float8 IS NULL OR created_at >= to_timestamp(%(since)s::float8))
  AND (%(until)s::float8 IS NULL OR created_at < to_timestamp(%(until)s::float8))
  AND (%(only)s::text[] IS NULL OR split_part(queue, '~', 1) = ANY(%(only)s::text[]))
  AND (%(hide)s::text[] IS NULL OR NOT split_part(queue, '~', 1) = ANY(%(hide)s::text[]))
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: observe_running
-- Each live session's running jobs, counted (plunder_jobs_running holds them by session).
SELECT session_id, count(*) AS n FROM plunder_jobs
WHERE status = 'running' AND session_id IS NOT NULL
GROUP BY session_id;
-- name: order_declare
-- batch. The ordered keys a batch of jobs names (migration 20), with what a failure does
-- as the latest enqueue says.
INSERT INTO plunder_ordered (key, on_failure)
SELECT u.key, u.on_failure
FROM unnest(%(key)s::text[], %(on_failure)s::text[]) AS u(key, on_failure)
ORDER BY u.key
ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure
WHERE plunder_ordered.on_failure <> excluded.on_failure;

-- name: order_lock_many
-- The first step of an ordered admission (plunder.store.ordering): those of :keys that are
-- ordered keys, their limit rows locked in key order until the transaction ends (the
-- admissions of a key take turns, with limit_lock's too), and whether each is paused.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT l.key, COALESCE(l.paused_until > clock.now, false) AS paused
FROM plunder_limits AS l, clock
WHERE l.key IN (SELECT o.key FROM plunder_ordered AS o WHERE o.key = ANY(%(keys)s::text[]))
ORDER BY l.key
FOR UPDATE OF l;

-- name: order_admit_many
-- The head of each of :keys (ordered, not paused, locked by order_lock_many) that is free,
-- admitted: its pending job first enqueued, and only if it is due — a later job never
-- passes it. Free: no job of the key runs or is admitted, and none ended failed since its
-- release if it stops on failure. A statement of its own after the locks, so that it sees
-- every admission that held them before. No SKIP LOCKED: a head another transaction holds
-- is waited for, never stepped over.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now),
heads AS (
    SELECT (SELECT h.id FROM plunder_jobs AS h
            WHERE h.limit_key = o.key AND h.status = 'pending'
            ORDER BY h.id LIMIT 1) AS id
    FROM plunder_ordered AS o
    WHERE o.key = ANY(%(keys)s::text[])
      AND NOT EXISTS (SELECT FROM plunder_jobs AS b
                      WHERE b.limit_key = o.key AND b.status IN ('pending', 'running')
                        AND b.run_at < '4000-01-01'::timestamptz)
      AND (o.on_failure = 'continue'
           OR NOT EXISTS (SELECT FROM plunder_jobs AS f
                          WHERE f.limit_key = o.key
                            AND f.status IN ('failed', 'timed_out', 'expired')
                            AND f.id > o.released_through)))
UPDATE plunder_jobs AS j
SET run_at = j.run_at - interval '200000000000 seconds'
FROM clock, heads
WHERE j.id = heads.id AND j.status = 'pending'
  AND j.run_at >= '4000-01-01'::timestamptz
  AND j.run_at <= clock.now + interval '200000000000 seconds'
RETURNING j.id, j.queue;

-- name: order_release
-- A stopped key let go past the jobs of it that ended failed so far.
UPDATE plunder_ordered
SET released_through = GREATEST(released_through, COALESCE(
    (SELECT max(id) FROM plunder_jobs
     WHERE limit_key = %(key)s AND status IN ('failed', 'timed_out', 'expired')), 0))
WHERE key = %(key)s
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
INSERT INTO plunder_ordered_queues (queue, on_failure) VALUES (%(queue)s, %(on_failure)s)
ON CONFLICT (queue) DO UPDATE SET on_failure = excluded.on_failure;

-- name: order_queue_clear
DELETE FROM plunder_ordered_queues WHERE queue = %(queue)s;

-- name: order_queue_list
SELECT queue, on_failure FROM plunder_ordered_queues ORDER BY queue;
-- Workflows (plunder.store.edges, migration 19) ------------------------------------------

-- name: edge_parents_mark
-- The parents of a graph being enqueued get children: their rows are written (so a parent
-- ending meanwhile waits for this transaction) and their status and queue read.
UPDATE plunder_jobs SET has_children = true
WHERE id = ANY(%(ids)s::bigint[])
RETURNING id, status, queue;

-- name: edge_insert
-- %(rows)s, a JSON array of [parent, child, policy]
INSERT INTO plunder_edges (parent_id, child_id, on_failure)
SELECT (r ->> 0)::bigint, (r ->> 1)::bigint, r ->> 2
FROM jsonb_array_elements(%(rows)s::jsonb) AS r;

-- name: edge_wait
-- Fresh children with parents not ended: waiting for that many.
UPDATE plunder_jobs SET status = 'waiting', parents_left = %(parents_left)s
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending';

-- name: edge_doom
-- Fresh children of a parent that ended other than succeeded, whose edge skips or fails
-- them: they end at once, never run.
UPDATE plunder_jobs
SET status = %(status)s, finished_at = COALESCE(%(now)s::timestamptz, statement_timestamp()),
    error = %(error)s
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending';

-- name: edge_list
-- The edges into or out of these jobs.
SELECT parent_id, child_id, on_failure FROM plunder_edges
WHERE parent_id = ANY(%(ids)s::bigint[])
UNION
SELECT parent_id, child_id, on_failure FROM plunder_edges
WHERE child_id = ANY(%(ids)s::bigint[])
ORDER BY parent_id, child_id;

-- name: edge_parent_results
-- What a child's parents ended with: each parent's status and result.
SELECT e.parent_id AS id, j.status, j.result
FROM plunder_edges AS e JOIN plunder_jobs AS j ON j.id = e.parent_id
WHERE e.child_id = %(job_id)s
ORDER BY e.parent_id;

-- name: edge_parent_results_claimed
-- The same for a child's current attempt only (fenced by its claim): no row when the
-- claim is not current (or the job unknown), one row with a NULL id when it has no parents.
SELECT e.parent_id AS id, j.status, j.result
FROM plunder_jobs AS c
LEFT JOIN plunder_edges AS e ON e.child_id = c.id
LEFT JOIN plunder_jobs AS j ON j.id = e.parent_id
WHERE c.id = %(job_id)s AND c.status = 'running' AND c.attempt = %(attempt)s
  AND c.session_id = %(session_id)s
ORDER BY e.parent_id;

-- name: flow_jobs
-- Every job of the workflow a job belongs to: those its edges join it to, either way.
WITH RECURSIVE member(id) AS (
    SELECT %(job_id)s::bigint
    UNION
    SELECT x.b FROM member AS m
    JOIN (SELECT parent_id AS a, child_id AS b FROM plunder_edges
          UNION ALL SELECT child_id, parent_id FROM plunder_edges) AS x ON x.a = m.id
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
SET status = 'cancelled', finished_at = COALESCE(%(now)s::timestamptz, statement_timestamp()),
    deadline_at = NULL, error = %(error)s
WHERE id = ANY(%(ids)s::bigint[]) AND status IN ('pending', 'waiting')
RETURNING id, queue, status, limit_key;
-- name: trace_put_many
-- The trace context of jobs just enqueued (%(ids)s), where the producer traced; a keyed
-- enqueue that found its job active keeps the context it was first enqueued under.
INSERT INTO plunder_traces (job_id, context)
SELECT id, %(context)s FROM unnest(%(ids)s::bigint[]) AS id
ON CONFLICT (job_id) DO NOTHING;

-- name: trace_get_many
-- The trace contexts of jobs just claimed (%(ids)s), where they have one.
SELECT job_id, context FROM plunder_traces WHERE job_id = ANY(%(ids)s::bigint[]);

-- name: queue_active_counts
-- Each queue's pending and running jobs, and the age of its oldest pending job that is due
-- (NULL for running): for metrics at scrape time, read from the partial indexes of those
-- statuses, never the finished jobs.
WITH clock AS (SELECT COALESCE(%(now)s::timestamptz, statement_timestamp()) AS now)
SELECT j.queue, 'pending' AS status, count(*) AS n,
       extract(epoch FROM clock.now - min(j.run_at) FILTER (WHERE j.run_at <= clock.now))::float8
           AS age
FROM plunder_jobs AS j, clock WHERE j.status = 'pending' GROUP BY j.queue, clock.now
UNION ALL
SELECT queue, 'running' AS status, count(*) AS n, NULL AS age
FROM plunder_jobs WHERE status = 'running' GROUP BY queue;
