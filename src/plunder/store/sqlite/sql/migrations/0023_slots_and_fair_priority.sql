-- plunder schema version 23 (docs/decisions/0019-slot-cost.md).
-- Slot cost: a session records its worker's slots (its -c); a claim skips a job costing
-- more than that, leaving it to a bigger worker. Sessions opened without saying (earlier
-- workers, direct store callers) take any cost, as before: the default is the highest
-- cost a job may have.
ALTER TABLE plunder_sessions ADD COLUMN slots INTEGER NOT NULL DEFAULT 1000 CHECK (slots >= 1);
-- Fair queues: a group's jobs are claimed in claim order, higher priority first, so the
-- index that walks one group holds its jobs in that order.
DROP INDEX plunder_jobs_fair;
CREATE INDEX plunder_jobs_fair ON plunder_jobs (queue, group_name, priority DESC, run_at, id)
    WHERE status = 'pending' AND group_name IS NOT NULL;
