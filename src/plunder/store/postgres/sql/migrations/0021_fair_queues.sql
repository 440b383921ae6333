-- plunder schema version 21: fair queues (docs/guide/fairness.md).
-- Fair queues (migration 21; docs/decisions/0012-fair-queues.md): a job's group (a
-- tenant) in group_name; a fair queue's claims take its groups in turn, by virtual time,
-- reading each group's due jobs on plunder_jobs_fair (only jobs with a group are in it).
ALTER TABLE plunder_jobs ADD COLUMN group_name TEXT;
CREATE INDEX plunder_jobs_fair ON plunder_jobs (queue, group_name, run_at, id)
    WHERE status = 'pending' AND group_name IS NOT NULL;
-- A fair queue and the weight of each group named (1 for the others).
CREATE TABLE plunder_fair_queues (
    queue TEXT PRIMARY KEY,
    weights JSONB NOT NULL DEFAULT '{}'
);
-- The groups of a fair queue that have (or recently had) pending jobs, each with its
-- virtual time: a claim serves the lowest first and moves it on by jobs taken / weight.
CREATE TABLE plunder_fair_groups (
    queue TEXT NOT NULL,
    group_name TEXT NOT NULL,
    vtime DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (queue, group_name)
);
CREATE INDEX plunder_fair_groups_turn ON plunder_fair_groups (queue, vtime, group_name);
