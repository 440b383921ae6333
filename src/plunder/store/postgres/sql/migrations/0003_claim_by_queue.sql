-- plunder schema version 3: fewer, sharper indexes on the hot table.
-- Every state change rewrites a job row, and a rewritten row is inserted into every index
-- whose predicate it matches, so each index costs on every claim and acknowledgement.
-- * Claims look up each of the worker's queues with `queue = $1` on an index led by the
--   queue: they read about LIMIT rows whatever the depth of the queue, with no sort and
--   whatever the planner's statistics say.
-- * Idempotency keys index only jobs that have one.
-- * People's listings and pruning walk the primary key; no listing index competes with
--   the claim index any more.

DROP INDEX plunder_jobs_claim;
CREATE INDEX plunder_jobs_claim ON plunder_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
DROP INDEX plunder_jobs_key;
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX plunder_jobs_listing;
DROP INDEX plunder_jobs_finished;
