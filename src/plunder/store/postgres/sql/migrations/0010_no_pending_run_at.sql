-- plunder schema version 10: no plunder_jobs_pending_run_at. No claim or wake-up reads
-- through it any more (job_next_due reads plunder_jobs_claim, one queue and level at a
-- time; only the stats' oldest pending age could, beside a count of every job), and a
-- claim whose walk of a level starts at the level's first job (job_claim_levels) has a
-- bound on run_at below as well as above: planned generically, it read the jobs of every
-- queue and level through this index instead of its own through plunder_jobs_claim (a
-- drain at half speed). Every enqueued job also wrote an entry here.
DROP INDEX IF EXISTS plunder_jobs_pending_run_at;
