"""The store's read of the trace contexts stored with jobs (plunder.store.traces
implements it; ``Store`` has it too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Traced(Protocol):
    def trace_get_many(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The stored trace context (W3C, as JSON text) of each of ``job_ids`` that has one."""
        ...
