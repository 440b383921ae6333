-- plunder schema version 11: workers publish the tasks they serve. A session names its
-- tasks and its free slots (renewed with each heartbeat), so that a job its worker failed
-- waits for another worker only while one that runs its task has room; and each task's
-- options are kept in plunder_tasks (the last worker to open a session wins), so that an
-- enqueue by name in a process without the task's code takes the task's own options.
ALTER TABLE plunder_sessions ADD COLUMN tasks TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE plunder_sessions ADD COLUMN free_slots INTEGER NOT NULL DEFAULT 0;

CREATE TABLE plunder_tasks (
    name TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    pool TEXT NOT NULL,
    options TEXT NOT NULL,
    session_id TEXT NOT NULL,
    published_at TIMESTAMPTZ NOT NULL
);
