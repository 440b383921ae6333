-- plunder schema version 6: the run that succeeded is kept on its job. A job that succeeds
-- ends with that run, so its worker, host, pid and captured logs are written by the
-- completion's own update of the job row (with status, result and finished_at; started_at
-- and session_id are on the row already), and the run history table holds only the runs
-- that ended otherwise (failed, timed out, lost, cancelled, released, stale), each written
-- once, when it ends. A running attempt is read from its job and its session. The common
-- path of a job therefore writes its job row twice (claim, completion) and nothing else.
-- Run rows left open by earlier versions are closed by the same statements as before.
-- A run row is now written once and never updated: no room is kept for its update.
ALTER TABLE plunder_jobs ADD COLUMN run_worker TEXT;
ALTER TABLE plunder_jobs ADD COLUMN run_host TEXT;
ALTER TABLE plunder_jobs ADD COLUMN run_pid INTEGER;
ALTER TABLE plunder_jobs ADD COLUMN run_logs TEXT;
ALTER TABLE plunder_runs RESET (fillfactor);
