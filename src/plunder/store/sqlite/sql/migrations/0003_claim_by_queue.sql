-- plunder schema version 3: fewer indexes on the hot table (every index costs on every
-- claim and acknowledgement). Idempotency keys index only jobs that have one; people's
-- listings and pruning walk the primary key. (SQLite's claim keeps walking
-- plunder_jobs_claim in claim order; its query names the index with INDEXED BY.)

DROP INDEX plunder_jobs_key;
CREATE UNIQUE INDEX plunder_jobs_key ON plunder_jobs (key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX plunder_jobs_listing;
DROP INDEX plunder_jobs_finished;
