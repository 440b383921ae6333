-- plunder schema version 6: the run that succeeded is kept on its job. A job that succeeds
-- ends with that run, so its worker, host, pid and captured logs are written by the
-- completion's own update of the job row (with status, result and finished_at; started_at
-- and session_id are on the row already), and the run history table holds only the runs
-- that ended otherwise (failed, timed out, lost, cancelled, released, stale), each written
-- once, when it ends. The claim writes who runs the attempt onto the job; a running attempt
-- is read from its job. After its insert, a job that succeeds at its first attempt is
-- written twice (claim, completion), and nothing else is.
-- An attempt that was running when this migration ran has the open history row its claim
-- wrote: its worker is copied onto the job here. If it ends other than in success, the
-- statement that writes its history row closes that open row instead; if it succeeds, the
-- open row stays and the job's own record of the run is read in its place (job_runs).
-- A history row is written once (only a row left open as above is ever updated): no room
-- is kept on its page for an update.
ALTER TABLE plunder_jobs ADD COLUMN run_worker TEXT;
ALTER TABLE plunder_jobs ADD COLUMN run_host TEXT;
ALTER TABLE plunder_jobs ADD COLUMN run_pid INTEGER;
ALTER TABLE plunder_jobs ADD COLUMN run_logs TEXT;
ALTER TABLE plunder_runs RESET (fillfactor);
UPDATE plunder_jobs AS j
SET run_worker = r.worker, run_host = r.host, run_pid = r.pid
FROM plunder_runs AS r
WHERE j.status = 'running' AND r.job_id = j.id AND r.attempt = j.attempt;
