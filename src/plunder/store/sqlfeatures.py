"""The SQL store's feature operations (fair queues, workflows, partitions and ordered keys,
limits, schedules), delegated to their parts: the half of SQLStore beside its core."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from plunder import cron, errors
from plunder.cron import Schedule, ScheduleSpec, Tick
from plunder.graph import Edge, Link, WorkflowState
from plunder.model import Claim, JobSpec, Lease, LimitState, PartitionedQueue
from plunder.store.acks import Acks
from plunder.store.driver import Now
from plunder.store.edges import Edges
from plunder.store.fairness import Fairness
from plunder.store.fairqueues import FairGroup
from plunder.store.limits import Limits
from plunder.store.ordering import Ordering
from plunder.store.partitioning import OrderedKey
from plunder.store.partitions import Partitions
from plunder.store.schedules import MakeJob, Schedules


class FeatureOps:
    """Made by SQLStore, which sets these parts."""

    acks: Acks
    fairness: Fairness
    edges: Edges
    partitions: Partitions
    ordering: Ordering
    limits: Limits
    schedules: Schedules

    # -- fair queues (plunder.store.fairness) ------------------------------------------------
    def fair_declare(self, queue: str, weights: Mapping[str, float] | None = None) -> None:
        if queue in self.partitions.partition_counts(fresh=0):
            raise errors.ConfigError(f"queue {queue!r} is partitioned: it cannot be fair too")
        self.fairness.fair_declare(queue, weights)

    def fair_queues(self, *, fresh: float = 5.0) -> dict[str, dict[str, float]]:
        return self.fairness.fair_queues(fresh=fresh)

    def fair_group_list(self) -> list[FairGroup]:
        return self.fairness.fair_group_list()

    def fair_prune_many(self, *, now: Now = None) -> tuple[int, int]:
        return self.fairness.fair_prune_many(now=now)

    # -- workflows (plunder.store.edges) ----------------------------------------------------
    def flow_enqueue(
        self,
        specs: Sequence[JobSpec],
        edges: Sequence[Edge],
        *,
        now: Now = None,
        visible: Callable[[str], bool] | None = None,
    ) -> list[int]:
        return self.edges.flow_enqueue(specs, edges, now=now, visible=visible)

    def flow_get(self, job_id: int) -> WorkflowState:
        return self.edges.flow_get(job_id)

    def flow_cancel(
        self, job_id: int, *, now: Now = None, visible: Callable[[str], bool] | None = None
    ) -> list[int]:
        return self.edges.flow_cancel(job_id, now=now, visible=visible)

    def edge_list(self, job_ids: Sequence[int]) -> list[Link]:
        return self.edges.edge_list(job_ids)

    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]:
        return self.edges.job_parent_results(job_id, claim=claim)

    # -- partitioned queues (plunder.store.partitions) ---------------------------------------
    def partition_declare(
        self, queue: str, partitions: int, *, ordered: bool | str | None = None
    ) -> None:
        self.partitions.partition_declare(queue, partitions, ordered=ordered)

    def order_release(self, key: str, *, now: Now = None) -> bool:
        return self.ordering.order_release(key, now=now)

    def order_list(self) -> list[OrderedKey]:
        return self.ordering.order_list()

    def partition_counts(self, *, fresh: float = 5.0) -> dict[str, int]:
        return self.partitions.partition_counts(fresh=fresh)

    def partition_list(self) -> list[PartitionedQueue]:
        return self.partitions.partition_list()

    def partition_assign_many(self, lease: Lease, *, now: Now = None) -> list[str]:
        return self.partitions.partition_assign_many(lease, now=now)

    # -- limits ----------------------------------------------------------------------------
    def limit_admit_many(self, keys: Collection[str], *, now: Now = None) -> int:
        return self.limits.limit_admit_many(keys, now=now)

    def limit_admit_due(self, *, now: Now = None) -> int:
        return self.limits.limit_admit_due(now=now)

    def limit_set(
        self, key: str, ceiling: int | None, rate: str | None = None, *, now: Now = None
    ) -> LimitState:
        return self.limits.limit_set(key, ceiling, rate, now=now)

    def limit_pause(self, key: str, seconds: float, *, now: Now = None) -> datetime:
        return self.limits.limit_pause(key, seconds, now=now)

    def job_pause_limit(
        self, claim: Claim, key: str, seconds: float, *, now: Now = None
    ) -> datetime:
        return self.limits.pause_claim(claim, key, seconds, self.acks.release, now=now)

    def limit_resume(self, key: str, *, now: Now = None) -> bool:
        return self.limits.limit_resume(key, now=now)

    def limit_list(self, *, now: Now = None) -> list[LimitState]:
        return self.limits.limit_list(now=now)

    # -- schedules (plunder.store.schedules) ------------------------------------------------
    def schedule_upsert(self, spec: ScheduleSpec, *, now: Now = None) -> Schedule:
        return self.schedules.schedule_upsert(spec, now=now)

    def schedule_get(self, name: str) -> Schedule:
        return self.schedules.schedule_get(name)

    def schedule_list(self) -> list[Schedule]:
        return self.schedules.schedule_list()

    def schedule_pause(self, name: str, paused: bool, *, now: Now = None) -> Schedule:
        return self.schedules.schedule_pause(name, paused, now=now)

    def schedule_remove(self, name: str) -> bool:
        return self.schedules.schedule_remove(name)

    def schedule_tick_many(
        self,
        lease: Lease,
        make: MakeJob,
        *,
        grace: float = cron.GRACE,
        limit: int = cron.TICKS_PER_PASS,
        now: Now = None,
    ) -> list[Tick]:
        return self.schedules.schedule_tick_many(lease, make, grace=grace, limit=limit, now=now)
