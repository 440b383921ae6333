-- plunder schema version 3: claims walk one queue's pending jobs in claim order.
-- The claim looks up each of the worker's queues with `queue = $1` on an index led by the
-- queue, so it reads LIMIT rows whatever the depth of the queue and whatever the planner's
-- statistics say; the listing indexes no longer offer (queue, status) to compete with it.

DROP INDEX plunder_jobs_claim;
CREATE INDEX plunder_jobs_claim ON plunder_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
DROP INDEX plunder_jobs_listing;
CREATE INDEX plunder_jobs_by_queue ON plunder_jobs (queue, id);
CREATE INDEX plunder_jobs_by_status ON plunder_jobs (status, id);
