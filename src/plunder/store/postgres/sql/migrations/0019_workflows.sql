-- plunder schema version 19: workflows (plunder.flows, docs/guide/workflows.md). A job may
-- wait for others: an edge (parent, child) with the child's policy should the parent end
-- other than succeeded. A child waits ('waiting') with parents_left counting its parents
-- not ended; the trigger plunder_jobs_settle, fired only when a job with children
-- (has_children) ends, counts it down in the same transaction (decision 0011).
ALTER TABLE plunder_jobs ADD COLUMN has_children BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE plunder_jobs ADD COLUMN parents_left INTEGER NOT NULL DEFAULT 0;
ALTER TABLE plunder_jobs DROP CONSTRAINT plunder_jobs_status_check;
ALTER TABLE plunder_jobs ADD CONSTRAINT plunder_jobs_status_check
    CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled',
                      'expired', 'waiting', 'skipped'));
-- Workflows (migration 19): the child waits for the parent; on_failure is what becomes of
-- the child should the parent end other than succeeded: 'run' it anyway, 'skip' it (it
-- ends skipped) or 'fail' it (it ends failed).
CREATE TABLE plunder_edges (
    parent_id BIGINT NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    child_id BIGINT NOT NULL REFERENCES plunder_jobs (id) ON DELETE CASCADE,
    on_failure TEXT NOT NULL CHECK (on_failure IN ('run', 'skip', 'fail')),
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX plunder_edges_child ON plunder_edges (child_id, parent_id);
-- When a job with children ends, in its transaction: each waiting child counts one parent
-- fewer, is pending once none is left (its queue's workers told), or ends skipped / failed
-- if this parent did not succeed and its edge says so (its waiters told); a child that so
-- ends settles its own children in turn. The count is one guarded row update, so parents
-- ending at once in several transactions take turns on the child's row and none is lost.
-- The trigger's WHEN clause keeps it off every job without children (decision 0011).
CREATE FUNCTION plunder_jobs_settle() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE woken text[]; ended text;
BEGIN
    WITH settled AS (
        UPDATE plunder_jobs AS c
        SET parents_left = c.parents_left - 1,
            status = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure = 'skip' THEN 'skipped'
                          WHEN NEW.status <> 'succeeded' AND e.on_failure = 'fail' THEN 'failed'
                          WHEN c.parents_left <= 1 THEN 'pending' ELSE 'waiting' END,
            finished_at = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure <> 'run'
                               THEN COALESCE(NEW.finished_at, statement_timestamp())
                               ELSE c.finished_at END,
            error = CASE WHEN NEW.status <> 'succeeded' AND e.on_failure <> 'run'
                         THEN json_build_object('type', 'plunder.ParentFailed', 'message',
                                                'parent job ' || NEW.id || ' ended '
                                                || NEW.status, 'traceback', '')::text
                         ELSE c.error END
        FROM plunder_edges AS e
        WHERE e.parent_id = NEW.id AND c.id = e.child_id AND c.status = 'waiting'
        RETURNING c.id, c.queue, c.status
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE status = 'pending'),
           string_agg(id::text, ',') FILTER (WHERE status <> 'pending' AND status <> 'waiting')
    INTO woken, ended FROM settled;
    -- wake the workers of the queues with children pending now, and the children's waiters
    IF woken IS NOT NULL THEN PERFORM pg_notify('plunder_enqueued', q) FROM unnest(woken) AS q; END IF;
    IF ended IS NOT NULL THEN PERFORM pg_notify('plunder_done', ended); END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER plunder_jobs_settle AFTER UPDATE OF status ON plunder_jobs
FOR EACH ROW WHEN (NEW.has_children AND OLD.status IS DISTINCT FROM NEW.status
                   AND NEW.status IN ('succeeded', 'failed', 'timed_out', 'cancelled',
                                      'expired', 'skipped'))
EXECUTE FUNCTION plunder_jobs_settle();
