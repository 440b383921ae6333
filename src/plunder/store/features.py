"""The store operations of plunder's features beside the core of claims and
acknowledgements (limits, partitions, metrics' reads, fair queues, schedules, workflows),
each declared in a module of its own; :class:`plunder.store.base.Store` has them all."""

from __future__ import annotations

from typing import Protocol

from plunder.store.extras import Extras
from plunder.store.fairqueues import FairOps
from plunder.store.flowing import FlowOps
from plunder.store.limiting import LimitOps
from plunder.store.scheduling import Scheduled


class Features(LimitOps, Extras, FairOps, Scheduled, FlowOps, Protocol):
    """Every feature's operations (see each base)."""
