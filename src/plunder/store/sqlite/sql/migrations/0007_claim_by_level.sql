-- plunder schema version 7: a claim reads as much however deep the queues are. The claim
-- index leads with the queue, as on PostgreSQL since version 3, so a worker never walks
-- the jobs of queues it does not serve; a claim reads each of its queues one priority
-- level at a time and, within a level, only the jobs due now (job_claim_level,
-- job_claim_walk), so it never walks the delayed jobs behind them either.
DROP INDEX plunder_jobs_claim;
CREATE INDEX plunder_jobs_claim ON plunder_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
