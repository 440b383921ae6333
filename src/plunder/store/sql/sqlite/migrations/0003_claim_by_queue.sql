-- plunder schema version 3: listing indexes by queue and by status. (SQLite's claim keeps
-- walking plunder_jobs_claim in claim order; its query names the index with INDEXED BY.)

DROP INDEX plunder_jobs_listing;
CREATE INDEX plunder_jobs_by_queue ON plunder_jobs (queue, id);
CREATE INDEX plunder_jobs_by_status ON plunder_jobs (status, id);
