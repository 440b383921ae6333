-- plunder schema version 5: running jobs are few (at most the workers' slots), so the
-- deadline reaper reads them all through plunder_jobs_running instead of an index of its
-- own, which every claim had to update. (On PostgreSQL this version also drops the
-- foreign keys of runs and events; SQLite checks them for an index lookup, and dropping
-- one would mean rebuilding the table.)
DROP INDEX plunder_jobs_deadline;
