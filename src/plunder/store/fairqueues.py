"""The store's operations on fair queues (plunder.store.fairness implements them;
``Store`` has them too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True, slots=True)
class FairGroup:
    """A group of a fair queue, as its row stands: its virtual time and weight."""

    queue: str
    group: str
    vtime: float
    weight: float


class FairOps(Protocol):
    def fair_declare(self, queue: str, weights: Mapping[str, float] | None = None) -> None:
        """Declare ``queue`` fair: its claims take its jobs' groups in turn, each group
        ``weights[group]`` jobs (1 if not named) for each of another's 1."""
        ...

    def fair_queues(self, *, fresh: float = 5.0) -> dict[str, dict[str, float]]:
        """The fair queues and their weights, read at most ``fresh`` s ago."""
        ...

    def fair_group_list(self) -> list[FairGroup]:
        """The groups of each fair queue in turn (lowest virtual time first)."""
        ...

    def fair_prune_many(self, *, now: datetime | None = None) -> tuple[int, int]:
        """The janitor's pass: the rows of groups without pending jobs pruned, those of
        groups with pending jobs but no row made; (pruned, made)."""
        ...
