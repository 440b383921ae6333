"""A worker's turns on PostgreSQL, as the store composes them: one statement
(job_exchange) for a turn of completions and a claim, and turns sent ahead (TurnPipe),
both built on the driver, the engine and the acknowledgements they are handed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cached_property

from plunder.model import AckResult, Claim, Completion, Exchange
from plunder.store.acks import Acks
from plunder.store.claims import check_claim
from plunder.store.engine import Engine
from plunder.store.postgres import turns
from plunder.store.postgres.driver import PgDriver


class PgTurns:
    """``at_once`` (see plunder.store.claims.TurnAtOnce) and ``pipe()`` (see
    plunder.store.base.TurnPipe) for a PostgreSQL store."""

    def __init__(self, driver: PgDriver, engine: Engine, acks: Acks) -> None:
        self.driver = driver
        self.engine = engine
        self.acks = acks
        self.fair: Callable[[Sequence[str]], bool] = lambda _queues: False  # set by the store

    def at_once(
        self,
        plain: list[tuple[Completion, str]],
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        now: datetime | None,
    ) -> Exchange | None:
        """One statement (job_exchange), committed in one round trip, where the database
        delivers NOTIFY (the statement notifies the result waiters)."""
        if not self.driver.notifies:
            return None
        params = turns.turn_params(
            plain, session_id, queues=queues, tasks=tasks, limit=limit, take_suspect=take_suspect
        )
        names, rows = self.engine.run(
            lambda tx: tx.table("job_exchange", **params, now=tx.clock(now)), single=True
        )
        answer = turns.Answer.of(self.support, plain, session_id, (names, rows))
        completed = answer.settle(now)
        return Exchange(completed, AckResult((), ()), tuple(answer.jobs()), answer.children)

    def pipe(self) -> turns.TurnPipe | None:
        """Turns sent ahead (see plunder.store.postgres.turns), on a connection of the pool
        held for them: not with a pool of one, which the pipe would keep from every other
        call."""
        if self.driver.pool_size < 2 or not self.driver.notifies:
            return None
        return turns.TurnPipe(self.support)

    @cached_property
    def support(self) -> turns.PipeSupport:
        """What the store lends its turns: values fixed at construction, and operations
        bound to its parts (the pool is looked up at each use: it is replaced after a
        fork)."""
        driver = self.driver
        return turns.PipeSupport(
            url=driver.url,
            queries=driver.queries,
            pool_size=driver.pool_size,
            deadlines=driver.deadlines,
            call_timeout=driver.call_timeout,
            hold=driver.pipe_connection,
            give_back=driver.give_back,
            check_claim=check_claim,
            encode=self.acks.encode_results,
            records=self.engine.claimed,
            settle=self._settle_apart,
            alive=self._session_alive,
            translate=driver.translate,
            fair=lambda queues: self.fair(queues),  # noqa: PLW0108 (set after this is made)
        )

    def _settle_apart(
        self, items: list[tuple[Completion, str]], now: datetime | None
    ) -> tuple[list[Claim], list[Claim]]:
        """Which of a turn's completions were accepted, in a transaction of its own."""
        return self.engine.run(lambda tx: self.acks.settle(tx, items, tx.clock(now)))

    def _session_alive(self, session_id: str, now: datetime | None) -> bool:
        row = self.engine.run(
            lambda tx: tx.one("session_alive", session_id=session_id, now=tx.clock(now)),
            single=True,
        )
        return row is not None
