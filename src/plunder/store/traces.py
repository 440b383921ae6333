"""The trace context each job was enqueued under, where its producer traced with
OpenTelemetry (plunder.tracing): written in the enqueue's transaction, read by the worker
that claims the job."""

from __future__ import annotations

from collections.abc import Sequence

from plunder.store.driver import Tx
from plunder.store.engine import Engine


class Traces:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(self, tx: Tx, job_ids: Sequence[int], context: str) -> None:
        """In the enqueue's transaction: ``context`` is the trace of these jobs (a keyed job
        found active keeps its first)."""
        tx.all("trace_put_many", ids=self.engine.list_in(list(job_ids)), context=context)

    def trace_get_many(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        rows = self.engine.run(
            lambda tx: tx.all("trace_get_many", ids=self.engine.list_in(list(job_ids))),
            write=False,
        )
        return {int(row["job_id"]): str(row["context"]) for row in rows}
