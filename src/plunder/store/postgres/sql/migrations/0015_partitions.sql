-- plunder schema version 15: partitioned queues. A queue declared with N partitions keeps
-- each job in the sub-queue of its partition ("q~3": a name no user queue can have); the
-- janitor assigns each partition to one live session serving the queue, and the
-- assignment's generation grows at every change of it.
CREATE TABLE plunder_partitions (
    queue TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL CHECK (partitions >= 1 AND partitions <= 1024),
    generation BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE plunder_partition_owners (
    queue TEXT NOT NULL,
    partition INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    PRIMARY KEY (queue, partition)
);
CREATE INDEX plunder_partition_owners_session ON plunder_partition_owners (session_id);
