-- plunder schema version 22: affinity and slot cost (docs/guide/affinity.md). A job may
-- prefer labels (affinity) or require them (require), each stored as '{k=v,...}' (sorted;
-- NULL: none), and take `cost` slots of its worker. A session holds its worker's labels,
-- and its free_slots count for claims only until free_until: each heartbeat and each
-- claim of a labelled session pushes it on, so a holder that stops (SIGSTOP, a hung
-- host) stops counting as free within that short window, long before it expires.
ALTER TABLE plunder_jobs ADD COLUMN affinity TEXT;
ALTER TABLE plunder_jobs ADD COLUMN require TEXT;
ALTER TABLE plunder_jobs ADD COLUMN cost INTEGER NOT NULL DEFAULT 1 CHECK (cost >= 1);
ALTER TABLE plunder_sessions ADD COLUMN labels TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE plunder_sessions ADD COLUMN free_until TIMESTAMPTZ;
