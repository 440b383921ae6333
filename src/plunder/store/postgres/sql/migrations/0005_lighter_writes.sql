-- plunder schema version 5: fewer writes per job on the hot path.
-- * Runs and events no longer reference their job by a foreign key: every row of theirs is
--   written by plunder in the very transaction that holds its job (claim, stream), and the
--   check cost a lookup and a row lock on the job for every run opened. Pruning a job
--   deletes its runs and events in the same statement (job_prune_many).
-- * A run is updated once, when it closes: room left on its page keeps that update from
--   writing a new index entry (a HOT update).
-- * Running jobs are few (at most the workers' slots), so the deadline reaper reads them
--   all through plunder_jobs_running instead of an index of its own, which every claim
--   had to update.
ALTER TABLE plunder_runs DROP CONSTRAINT plunder_runs_job_id_fkey;
ALTER TABLE plunder_events DROP CONSTRAINT plunder_events_job_id_fkey;
ALTER TABLE plunder_runs SET (fillfactor = 80);
DROP INDEX plunder_jobs_deadline;
