"""Leases and the janitor's sweeps: every write checks the lease and its term in the same
transaction, so a holder that lost its lease changes nothing."""

from __future__ import annotations

from typing import Any

from plunder import errors, payload
from plunder.model import ErrorInfo, Lease, SweepResult
from plunder.states import Outcome
from plunder.store import convert
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import JOB_EXPIRED, JOB_TIMEOUT, SESSION_LOST, Engine

# the jobs table's statistics are taken anew once it has grown this many times over the
# size they saw, counted from at least MIN_PAGES pages (PostgreSQL's own floor for a table
# it knows nothing about): a tenfold growth is a handful of ANALYZEs on the way from an
# empty table to a large one
GROWTH = 10
MIN_PAGES = 10
MIN_ROWS = 300  # about MIN_PAGES of jobs: the floor for the live rows against those counted
# plunder_jobs is vacuumed once this many dead row versions more than its last VACUUM
# left have piled up (two a job claimed and ended), or a hundredth of its live rows if more:
# a claim then reads at most the dead entries of ~10,000 claimed jobs at the head of
# plunder_jobs_claim (about 60 pages), and a VACUUM, which reads every index whole, runs
# at most about once per 1% of the table changed (docs/decisions/0027)
VACUUM_DEAD = 20_000
VACUUM_SHARE = 100


class Maintenance:
    """The janitor's operations: leases, and sweeps fenced by the lease."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._analyzed_at = 0  # pages of the jobs table at the last job_stats_refresh
        self._analyzed_rows = 0  # and its live rows then
        self._dead_left = 0  # dead row versions the last job_table_vacuum could not remove

    def lease_acquire(self, name: str, holder: str, ttl: float, *, now: Now = None) -> Lease | None:
        convert.positive("lease ttl", ttl)
        row = self.engine.run(
            lambda tx: tx.one(
                "lease_acquire", name=name, holder=holder, ttl=float(ttl), now=tx.clock(now)
            )
        )
        return self.engine.lease(row) if row else None

    def lease_renew(self, lease: Lease, ttl: float, *, now: Now = None) -> Lease:
        convert.positive("lease ttl", ttl)
        row = self.engine.run(
            lambda tx: tx.one(
                "lease_renew",
                name=lease.name,
                holder=lease.holder,
                term=lease.term,
                ttl=float(ttl),
                now=tx.clock(now),
            )
        )
        if row is None:
            raise errors.StaleLease(
                f"lease {lease.name!r} term {lease.term} is no longer held by {lease.holder}"
            )
        return self.engine.lease(row)

    def lease_release(self, lease: Lease, *, now: Now = None) -> bool:
        row = self.engine.run(
            lambda tx: tx.one(
                "lease_release",
                name=lease.name,
                holder=lease.holder,
                term=lease.term,
                now=tx.clock(now),
            )
        )
        return row is not None

    def lease_get(self, name: str) -> Lease | None:
        row = self.engine.run(lambda tx: tx.one("lease_get", name=name), write=False)
        return self.engine.lease(row) if row else None

    def fence(self, tx: Tx, lease: Lease, clock: Any) -> None:
        """Raise StaleLease in ``tx`` unless ``lease`` is held (for janitor writes made
        elsewhere: plunder.store.partitions)."""
        self._fence(tx, lease, clock)

    def _fence(self, tx: Tx, lease: Lease, clock: Any) -> None:
        if (
            tx.one("lease_check", name=lease.name, holder=lease.holder, term=lease.term, now=clock)
            is None
        ):
            raise errors.StaleLease(
                f"lease {lease.name!r} term {lease.term} is no longer held "
                f"by {lease.holder}; the janitor write was refused"
            )

    def session_reap_many(self, lease: Lease, *, limit: int = 100, now: Now = None) -> SweepResult:
        error = payload.encode(SESSION_LOST.as_dict())

        def op(tx: Tx) -> SweepResult:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            dead = [str(r["id"]) for r in tx.all("session_expired", now=clock, limit=int(limit))]
            lost = self.lose(tx, dead, clock, error)  # also running jobs whose session is gone
            if not dead:
                return convert.sweep(lost)
            gone = tx.all("session_delete_many", session_ids=self.engine.list_in(dead), now=clock)
            return convert.sweep(lost, sessions=[str(r["id"]) for r in gone])

        return self.engine.run(op)

    def lose(
        self, tx: Tx, session_ids: list[str], clock: Any, error: str | None = None
    ) -> list[Row]:
        """End the running attempts of these sessions — and of any session that no longer
        exists (a claim that committed after its session was reaped) — as ``lost``. Each
        run records the error its job got: SESSION_LOST, or the WorkerLost of a job whose
        retry_on_lost is off."""
        error = error or payload.encode(SESSION_LOST.as_dict())
        lost = tx.all(
            "job_lose_many", session_ids=self.engine.list_in(session_ids), error=error, now=clock
        )
        self.engine.announce(tx, lost)
        tx.batch(
            "run_close",
            [
                convert.run_end(
                    r["id"],
                    r["attempt"],
                    r["session_id"],
                    outcome=Outcome.LOST,
                    error=ErrorInfo.from_dict(payload.decode(r["error"])),
                )
                for r in lost
            ],
            now=clock,
        )
        return lost

    def job_timeout_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        error = payload.encode(JOB_TIMEOUT.as_dict())

        def op(tx: Tx) -> SweepResult:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            due = {
                (int(r["id"]), int(r["attempt"])): r["session_id"]
                for r in tx.all("job_timeout_due", limit=int(limit), now=clock)
            }
            if not due:
                return convert.sweep([])
            rows = tx.all(
                "job_timeout_many",
                job_ids=self.engine.list_in([job_id for job_id, _ in due]),
                error=error,
                now=clock,
            )
            self.engine.announce(tx, rows)
            tx.batch(
                "run_close",
                [
                    convert.run_end(
                        r["id"],
                        r["attempt"],
                        due[int(r["id"]), int(r["attempt"])],
                        outcome=Outcome.TIMED_OUT,
                        error=JOB_TIMEOUT,
                    )
                    for r in rows
                ],
                now=clock,
            )
            return convert.sweep(rows)

        return self.engine.run(op)

    def job_expire_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        """Pending jobs past their start-by deadline end ``expired`` (``finished``)."""
        error = payload.encode(JOB_EXPIRED.as_dict())

        def op(tx: Tx) -> SweepResult:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            rows = tx.all("job_expire_many", limit=int(limit), error=error, now=clock)
            self.engine.announce(tx, rows)
            return convert.sweep(rows)

        return self.engine.run(op)

    def job_prune_many(
        self, lease: Lease, *, older_than: float, limit: int = 1000, now: Now = None
    ) -> int:
        """Finished jobs past retention are found by a read (``job_prune_find``: with none
        to prune, it reads the whole table, and SQLite's write lock is not held meanwhile),
        then deleted under the fence if they are still finished past retention."""
        convert.non_negative("retention", older_than)
        retention = float(older_than)
        found = self.engine.run(
            lambda tx: [
                row["id"]
                for row in tx.all(
                    "job_prune_find", older_than=retention, limit=int(limit), now=tx.clock(now)
                )
            ],
            write=False,
        )

        def op(tx: Tx) -> int:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            if not found:
                return 0
            ids = self.engine.list_in(found)
            return len(tx.all("job_prune_many", ids=ids, older_than=retention, now=clock))

        return self.engine.run(op)

    def job_stats_refresh(self) -> bool:
        """Take new statistics of the jobs table when it has grown tenfold since the last
        were taken (at least to GROWTH * MIN_PAGES pages), or its live rows have outgrown
        tenfold the rows they counted (at least GROWTH * MIN_ROWS: a table refilled within
        the pages a VACUUM kept), so that every connection plans its cached statements for
        the table as it is (see the job_table_pages query). True: it did. Nothing to do on
        SQLite, which plans each statement as it prepares it."""
        if not self.engine.driver.caches_plans:
            return False
        row = self.engine.run(lambda tx: tx.one("job_table_pages"), write=False)
        if row is None:
            return False
        pages, live = int(row["pages"]), int(row["live"])
        # the size this store last analyzed at counts too: an ANALYZE the server skipped
        # (the table locked, or a role that does not own it: only a warning) is not tried
        # again at every pass, only once the table has grown tenfold again
        grown = pages > GROWTH * max(int(row["seen"]), self._analyzed_at, MIN_PAGES)
        refilled = live > GROWTH * self._analyzed_rows
        # only once the server counts the rows too: pages written by a bulk insert that
        # has not committed yet would give statistics of an empty table, which no later
        # pass took again (the table had "grown"), and a 100,000-job backlog then drained
        # at a fifth of its speed (docs/performance.md)
        counted_more = live > GROWTH * max(int(row["counted"]), MIN_ROWS)
        if not (counted_more and (grown or refilled)):
            return False
        self.engine.run(lambda tx: tx.all("job_table_analyze"))
        self._analyzed_at, self._analyzed_rows = pages, live
        return True

    def job_table_vacuum(self) -> bool:
        """VACUUM the jobs table once its dead row versions have grown by VACUUM_DEAD (or
        a hundredth of its live rows) since the last one left some behind: the dead index
        entries a claim reads at the head of its queue (see the job_table_vacuum query).
        True: it did. Nothing to do where an update takes its index entries out at once
        (SQLite). What a VACUUM cannot remove (a transaction older than it still sees them,
        or a role that may not vacuum the table: only a warning) counts as left behind, so
        it is not tried again at every pass."""
        if not self.engine.driver.vacuums:
            return False
        row = self.engine.run(lambda tx: tx.one("job_table_pages"), write=False)
        if row is None:
            return False
        dead = int(row["dead"])
        if dead - self._dead_left < max(VACUUM_DEAD, int(row["live"]) // VACUUM_SHARE):
            return False
        self.engine.driver.statement_alone("job_table_vacuum")
        after = self.engine.run(lambda tx: tx.one("job_table_pages"), write=False)
        self._dead_left = int(after["dead"]) if after is not None else 0
        return True
