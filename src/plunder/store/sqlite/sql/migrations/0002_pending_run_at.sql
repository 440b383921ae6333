-- plunder schema version 2: an index for finding the next due pending job.

CREATE INDEX plunder_jobs_pending_run_at ON plunder_jobs (run_at) WHERE status = 'pending';
