-- plunder schema version 12: a job's policy for a run lost with its worker
-- (retry_on_lost: retried, as before, or ended at once) and its start-by deadline
-- (expires_at: a pending job not started by then ends in the new terminal status
-- 'expired', and no claim takes it).
ALTER TABLE plunder_jobs ADD COLUMN retry_on_lost BOOLEAN NOT NULL DEFAULT TRUE;
ALTER TABLE plunder_jobs ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE plunder_jobs DROP CONSTRAINT plunder_jobs_status_check;
ALTER TABLE plunder_jobs ADD CONSTRAINT plunder_jobs_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled',
                      'expired'));
-- The janitor's walk of the pending jobs past their start-by deadline (job_expire_many).
CREATE INDEX plunder_jobs_expires ON plunder_jobs (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
