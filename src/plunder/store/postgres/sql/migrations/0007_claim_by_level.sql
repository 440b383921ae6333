-- plunder schema version 7: a claim reads as much however deep the queues are. On
-- PostgreSQL the claim index already leads with the queue (version 3); the claim now reads
-- each queue one priority level at a time and, within a level, only the jobs due now (see
-- job_claim_many). The schema itself does not change; the index says what it is for.
COMMENT ON INDEX plunder_jobs_claim IS
    'claims: one queue, one priority level at a time, the jobs due now first';
