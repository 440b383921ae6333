-- plunder schema version 23: slot cost (docs/guide/routing.md, decision 0019). A session
-- records its worker's slots (its -c); a claim skips a job costing more than that, leaving
-- it to a bigger worker. Sessions opened without saying (earlier workers, direct store
-- callers) take any cost, as before: the default is the highest cost a job may have.
ALTER TABLE plunder_sessions ADD COLUMN slots INTEGER NOT NULL DEFAULT 1000 CHECK (slots >= 1);
