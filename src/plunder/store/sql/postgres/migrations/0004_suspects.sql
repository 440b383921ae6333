-- plunder schema version 4: suspects. A job whose worker died while running it may be the
-- job that killed the worker (a poison job) or an innocent neighbour of one; no one can
-- tell which. Until it runs to an outcome again it is a suspect, and a worker runs at
-- most one suspect at a time, so a poison job cannot take the same neighbours down with
-- it on every attempt (each innocent job is lost with a given poison job at most once).
ALTER TABLE plunder_jobs ADD COLUMN suspect BOOLEAN NOT NULL DEFAULT false;
