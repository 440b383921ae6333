-- plunder schema version 17: paused queues. A claim takes no job of a queue listed here
-- (nor of its partitions); the jobs running in it run on. Stores read the table at most
-- once a second (plunder.store.pauses): the list stays small, one row per paused queue.
CREATE TABLE plunder_queue_pauses (
    queue TEXT PRIMARY KEY,
    paused_at REAL NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);
