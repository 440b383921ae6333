-- plunder schema version 4: losses, and suspects. A job whose worker died while running it
-- may be the job that killed the worker (a poison job) or an innocent neighbour of one; no
-- one can tell which. `losses` counts such deaths since the job last ran to an outcome. A
-- job lost twice or more is a suspect, and a worker runs at most one suspect at a time, so
-- a poison job cannot take the same neighbours down with it on every attempt, while the
-- jobs of a worker that died once (the common case) are rescued in parallel as before.
ALTER TABLE plunder_jobs ADD COLUMN losses INTEGER NOT NULL DEFAULT 0 CHECK (losses >= 0);
