"""The limit operations of the store seam (plunder.store.base.Store has them): see
plunder.store.limits for how admission enforces a limit, and docs/guide/limits.md."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Protocol

from plunder.model import Claim, LimitState

Now = datetime | None


class LimitOps(Protocol):
    def limit_admit_many(self, keys: Collection[str], *, now: Now = None) -> int:
        """Admit the held jobs of these keys that their limits allow now; how many."""
        ...

    def limit_admit_due(self, *, now: Now = None) -> int:
        """Admit, for every key not paused, the held jobs that are due and its limit allows
        (the janitor's pass); how many."""
        ...

    def limit_set(
        self, key: str, ceiling: int | None, rate: str | None = None, *, now: Now = None
    ) -> LimitState:
        """Set a key's ceiling and rate (None: none); its jobs are admitted as it allows."""
        ...

    def limit_pause(self, key: str, seconds: float, *, now: Now = None) -> datetime:
        """Admit none of the key's jobs for ``seconds`` (a longer pause already set stays);
        its jobs admitted but not claimed are held again. Returns when the pause ends."""
        ...

    def job_pause_limit(
        self, claim: Claim, key: str, seconds: float, *, now: Now = None
    ) -> datetime:
        """limit_pause, and in the same transaction the claimed job given back to wait for
        the pause's end (fenced; without spending an attempt). StaleClaim if not current."""
        ...

    def limit_resume(self, key: str, *, now: Now = None) -> bool:
        """End the key's pause; False when the key has no limit."""
        ...

    def limit_list(self, *, now: Now = None) -> list[LimitState]:
        """Every limit, with its jobs running, admitted and held."""
        ...
