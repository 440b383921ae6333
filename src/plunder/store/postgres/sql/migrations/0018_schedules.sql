-- plunder schema version 18: schedules (docs/guide/periodic.md). The janitor's lease holder
-- enqueues each due tick of a schedule once: it moves next_at past the ticks it enqueues
-- with a compare-and-set, in the transaction that enqueues them under its lease.
CREATE TABLE plunder_schedules (
    name TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    queue TEXT,
    cron TEXT NOT NULL,
    timezone TEXT NOT NULL,
    args TEXT NOT NULL DEFAULT '[]',
    kwargs TEXT NOT NULL DEFAULT '{}',
    catch_up TEXT NOT NULL CHECK (catch_up = 'all' OR catch_up = 'latest' OR catch_up = 'none'),
    paused BOOLEAN NOT NULL DEFAULT FALSE,
    next_at TIMESTAMPTZ,
    last_at TIMESTAMPTZ,
    last_job_id BIGINT,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX plunder_schedules_due ON plunder_schedules (next_at) WHERE NOT paused;
