"""What a claim reads does not grow with the depth of any queue: not with the jobs of queues
the worker does not serve, nor with the delayed jobs behind the due ones, at any priority
level. And it still takes the best jobs, across queues and levels, in claim order."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from plunder.model import SUSPECT_LOSSES, Completion, JobRecord, JobSpec
from plunder.store import Store, open_store
from tests.store.helpers import claim, database_work, enqueue, later, open_session

DAY = 86_400.0
GROWTH_FLOOR_PAGES = 10  # plunder.store.maintenance.MIN_PAGES
DEEP = 40_000


def _fill(store: Store, depth: int, now: datetime) -> None:
    """``depth`` jobs a claim on queue "mine" must not take: half due now in another queue
    (enqueued first, so they come first by priority, run_at and id), half in "mine" but due
    tomorrow, at the levels of the jobs the claim does take and at one below them."""
    other = [JobSpec("t", [i], queue="other") for i in range(depth // 2)]
    later_ = [
        JobSpec("t", [i], queue="mine", delay=DAY, priority=(5, 0, -1)[i % 3])
        for i in range(depth - depth // 2)
    ]
    for start in range(0, depth, 5_000):
        store.job_enqueue_ids((other + later_)[start : start + 5_000], now=now)


def _claim_work(store: Store, store_url: str, depth: int, *, due: int, limit: int) -> int:
    now = store.now()
    _fill(store, depth, now)
    enqueue(store, *[JobSpec("t", [i], queue="mine", priority=(5, 0)[i % 2]) for i in range(due)])
    session = open_session(store, queues=["mine"])

    taken: list[JobRecord] = []

    def run() -> list[JobRecord]:
        taken.extend(claim(store, session, queues=["mine"], limit=limit))
        return taken

    params = {
        "session_id": session.id,
        "queues": ["mine"],
        "tasks": ["t"],
        "limit": limit,
        "take_suspect": True,
        "suspect_losses": SUSPECT_LOSSES,
    }
    # on PostgreSQL the claim EXPLAINed is rolled back
    work = database_work(store, store_url, run, "job_claim_many", params)
    while got := claim(store, session, queues=["mine"], limit=limit):
        taken += got
    assert sorted(j.args[0] for j in taken) == list(range(due))  # the due ones, no other
    return work


def test_a_claim_that_finds_few_jobs_reads_as_much_behind_a_deep_queue(
    store: Store, store_url: str, backend: str
) -> None:
    """Fewer due jobs than the claim asks for: it must stop at the first delayed job of each
    level, not walk every one of them (nor the other queue's jobs)."""
    shallow = _claim_work(store, store_url, 600, due=6, limit=50)
    deep = _claim_work(store, store_url, DEEP, due=6, limit=50)
    assert deep < 2 * shallow + 20, f"{backend}: {shallow} at depth 600, {deep} at {DEEP:,}"


def test_a_full_claim_reads_as_much_behind_a_deep_queue(
    store: Store, store_url: str, backend: str
) -> None:
    shallow = _claim_work(store, store_url, 600, due=80, limit=60)
    deep = _claim_work(store, store_url, DEEP, due=80, limit=60)
    assert deep < 2 * shallow + 20, f"{backend}: {shallow} at depth 600, {deep} at {DEEP:,}"


def _next_due_work(store: Store, store_url: str, depth: int, now: datetime) -> int:
    _fill(store, depth, now)
    enqueue(store, JobSpec("t", ["soon"], queue="mine", priority=-1, delay=60.0), now=now)
    answers: list[float | None] = []

    def run() -> None:
        answers.append(store.job_next_due(queues=["mine"], tasks=["t"], now=now))

    if store_url.startswith("postgresql"):
        # the statistics of the table as it is now, as the janitor takes them once it grew
        # (job_table_pages): with them, a reading that sorted each level's jobs read them all
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("ANALYZE plunder_jobs")
    params = {"queues": ["mine"], "tasks": ["t"]}
    work = database_work(store, store_url, run, "job_next_due", params)
    run()
    assert answers[-1] == pytest.approx(60.0, abs=1e-3)
    return work


def test_when_the_next_job_is_due_reads_as_much_behind_a_deep_queue(
    store: Store, store_url: str, backend: str
) -> None:
    """An idle worker reads when its next job is due (to know how long it may sleep) as a
    claim reads: not through the other queue's jobs, nor its own queue's delayed ones."""
    now = store.now()
    shallow = _next_due_work(store, store_url, 600, now)
    deep = _next_due_work(store, store_url, DEEP, now)
    assert deep < 2 * shallow + 20, f"{backend}: {shallow} at depth 600, {deep} at {DEEP:,}"


def test_claims_take_the_best_due_jobs_across_queues_and_levels(store: Store) -> None:
    """Random mixes of queues, priority levels and due times, claimed in random batches
    from random sets of queues, against the rule: the due jobs of the listed queues, best
    priority first, then earliest run_at, then lowest id."""
    rng = random.Random(7)
    t0 = store.now()
    for round_ in range(16):
        queues = [f"q{round_}-{n}" for n in range(3)]
        # every other round, more priority levels than a claim reads one by one
        levels = (-3, 0, 0, 1, 7) if round_ % 2 else tuple(range(-20, 21))
        specs = [
            JobSpec(
                "t",
                [i],
                queue=rng.choice(queues),
                priority=rng.choice(levels),
                delay=rng.choice((0.0, 0.0, 1.0, 2.0, 30.0, DAY)),
            )
            for i in range(rng.randint(1, 120))
        ]
        jobs = enqueue(store, *specs, now=t0)
        at = later(t0, rng.choice((0.5, 1.5, 2.5, 60.0)))
        served = rng.sample(queues, rng.randint(1, 3))
        session = open_session(store, queues=served, name=f"w{round_}", expiry=DAY, now=t0)
        left = sorted(
            (j for j in jobs if j.queue in served and j.run_at <= at),
            key=lambda j: (-j.priority, j.run_at, j.id),
        )
        while True:
            limit = rng.randint(1, 25)
            got = claim(store, session, queues=served, limit=limit, now=at)
            assert [j.id for j in got] == [j.id for j in left[:limit]], f"round {round_}"
            left = left[limit:]
            if not got:
                break
        assert left == []


def test_a_queue_named_twice_is_read_once(store: Store) -> None:
    jobs = enqueue(store, *[JobSpec("t", [i], queue="a") for i in range(4)])
    session = open_session(store, queues=["a"])
    got = claim(store, session, queues=["a", "a"], limit=4)
    assert [j.id for j in got] == [j.id for j in jobs]


def test_a_claim_below_many_levels_still_takes_the_best_due_jobs(store: Store) -> None:
    """More levels than a claim probes one by one, most of them delayed: the due jobs below
    them are found (by the walk of the rest of the queue), in claim order."""
    t0 = store.now()
    enqueue(store, *[JobSpec("t", ["later", p], priority=p, delay=DAY) for p in range(100, 0, -1)])
    due = enqueue(store, *[JobSpec("t", ["due", p], priority=p) for p in (50, -5, 3, -5)], now=t0)
    session = open_session(store)
    got = claim(store, session, limit=10)
    assert [j.id for j in got] == [due[0].id, due[2].id, due[1].id, due[3].id]


def _counters(
    probe: Any, end_a_transaction: Callable[[], object], index: str | None = "plunder_jobs_pkey"
) -> tuple[int, int]:
    """The server's counters of plunder_jobs: index entries read (through ``index``, or
    through every index of the table), and rows read by sequential scans. A backend reports
    its counters at the end of a transaction a second or more after its last report: wait,
    then end one more."""
    time.sleep(1.1)
    end_a_transaction()
    time.sleep(0.3)
    probe.execute("SELECT pg_stat_clear_snapshot()")
    row = probe.execute(
        "SELECT sum(i.idx_tup_read), max(coalesce(t.seq_tup_read, 0)) "
        "FROM pg_stat_user_indexes AS i JOIN pg_stat_user_tables AS t USING (relid) "
        "WHERE t.relname = 'plunder_jobs' AND i.indexrelname = coalesce(%s, i.indexrelname)",
        (index,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _prepared_claims(
    store_url: str, probe: Any
) -> tuple[Store, Callable[[int], int], Callable[[], tuple[int, int]]]:
    """A store of one connection (the one that prepares) with a session on queue "mine":
    the store, a claim of up to n jobs (how many it took), and the server's counters read
    around one more claim (see _counters)."""
    claims = open_store(store_url, pool_size=1)
    session = open_session(claims, queues=["mine"])

    def take(limit: int) -> int:
        return len(claim(claims, session, queues=["mine"], limit=limit))

    return claims, take, lambda: _counters(probe, lambda: take(1))


def _five_claims(
    take: Callable[[int], int], counters: Callable[[], tuple[int, int]]
) -> tuple[int, int]:
    """Index entries read and rows read by sequential scans around five claims of 20."""
    keys, scanned = counters()
    assert sum(take(20) for _ in range(5)) == 100
    keys_after, scanned_after = counters()
    return keys_after - keys, scanned_after - scanned


def _found_by_key(take: Callable[[int], int], counters: Callable[[], tuple[int, int]]) -> None:
    """Five claims of 20 probe the primary key about once per job and scan nothing."""
    keys, scanned = _five_claims(take, counters)
    assert scanned == 0
    assert keys <= 2 * (100 + 1), keys


def test_a_prepared_next_due_reads_a_few_entries_on_a_deep_queue(
    store_url: str, backend: str
) -> None:
    """When the next job is due, read by a prepared statement (one generic plan, as plunder's
    PostgreSQL connections run it): a few index entries per read, no sequential scan, with
    10,000 jobs due now in another queue and 10,000 due tomorrow in its own."""
    if backend != "postgres":
        pytest.skip("generic plans of prepared statements are PostgreSQL's")
    import psycopg

    setup = open_store(store_url)
    for queue, delay in (("other", 0.0), ("mine", DAY)):
        setup.job_enqueue_ids([JobSpec("t", [i], queue=queue, delay=delay) for i in range(10_000)])
    setup.close()
    probe = psycopg.connect(store_url, autocommit=True)
    probe.execute("ANALYZE plunder_jobs")
    reader = open_store(store_url, pool_size=1)  # one connection: the one that prepares

    def due() -> object:
        return reader.job_next_due(queues=["mine"], tasks=["t"])

    try:
        assert all(due() is not None for _ in range(8))  # prepared after five runs
        reads, scanned = _counters(probe, due, index=None)
        for _ in range(10):
            due()
        reads_after, scanned_after = _counters(probe, due, index=None)
    finally:
        reader.close()
        probe.close()
    assert scanned_after - scanned == 0
    assert reads_after - reads <= 11 * 10, reads_after - reads


def test_a_prepared_claim_finds_its_jobs_by_key_on_a_deep_queue(
    store: Store, store_url: str, backend: str
) -> None:
    """plunder's PostgreSQL connections prepare their statements with one generic plan
    (``plan_cache_mode=force_generic_plan``), planned without the values of LIMIT or of the
    queue. A generic claim once read the whole table on every run (a sequential scan, or a
    merge join along the whole primary key, to find the 20 jobs it had chosen). The server's
    own counters, around five claims of 20 on a connection that has prepared the claim:
    the primary key probed about once per claimed job, no sequential scan."""
    if backend != "postgres":
        pytest.skip("generic plans of prepared statements are PostgreSQL's")
    import psycopg

    for queue, delay in (("other", 0.0), ("mine", DAY), ("mine", 0.0)):
        store.job_enqueue_ids([JobSpec("t", [i], queue=queue, delay=delay) for i in range(10_000)])
    probe = psycopg.connect(store_url, autocommit=True)
    probe.execute("ANALYZE plunder_jobs")
    claims, take, counters = _prepared_claims(store_url, probe)
    try:
        assert sum(take(20) for _ in range(8)) == 160  # prepared after five runs
        _found_by_key(take, counters)
    finally:
        claims.close()
        probe.close()


def test_a_claim_prepared_on_an_empty_table_finds_its_jobs_by_key_once_it_grew(
    store: Store, store_url: str, backend: str
) -> None:
    """A connection keeps the generic plan it made when it prepared the claim. Made by the
    statistics of an empty table, that plan read the whole table on every claim (a worker
    that waited on an empty queue then drained a burst at a sixth of its speed), until
    job_stats_refresh (a janitor's pass) took new statistics once the table had grown
    tenfold. The claim is planned by its indexes instead (see the plans_by_index query):
    the primary key probed about once per claimed job and no sequential scan, before the
    refresh as after it. On SQLite there is nothing to refresh."""
    if backend != "postgres":
        assert store.job_stats_refresh() is False
        return
    import psycopg

    probe = psycopg.connect(store_url, autocommit=True)
    _no_autovacuum(probe)  # else it may take the statistics before the refresh does
    claims, take, counters = _prepared_claims(store_url, probe)
    try:
        assert sum(take(20) for _ in range(8)) == 0  # prepared, on an empty table
        store.job_enqueue_ids([JobSpec("t", [i], queue="mine") for i in range(20_000)])
        _found_by_key(take, counters)
        _counted(probe, 20_000, store)
        assert store.job_stats_refresh() is True  # new statistics: planned anew, by them
        assert store.job_stats_refresh() is False  # its statistics see the table as it is
        _found_by_key(take, counters)
    finally:
        claims.close()
        probe.close()


def _counted(probe: Any, rows: int, store: Store) -> None:
    """Wait until the server counts ``rows`` live jobs (a connection reports its rows
    after its transactions, within a second or so)."""
    deadline = time.monotonic() + 15
    while True:
        probe.execute("SELECT pg_stat_clear_snapshot()")
        row = probe.execute(
            "SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'plunder_jobs'"
        ).fetchone()
        if row is not None and int(row[0]) >= rows:
            return
        assert time.monotonic() < deadline, "the server never counted the new rows"
        time.sleep(0.2)
        store.job_list(limit=1)


def _no_autovacuum(probe: Any) -> None:
    """Autovacuum analyzes a table that grew by 20,000 rows on its own, at a moment of its
    choosing: the statistics these tests watch are then the server's, not the store's."""
    probe.execute("ALTER TABLE plunder_jobs SET (autovacuum_enabled = false)")


def test_no_statistics_of_a_bulk_insert_not_committed_yet(
    store: Store, store_url: str, backend: str
) -> None:
    """Pages written by an insert still in progress look like growth, but ANALYZE counts
    none of their rows: statistics taken then said the table was empty, and since it had
    "grown" no later pass took them again; a 100,000-job backlog then drained at a fifth of
    its speed. The refresh waits until the server counts the rows."""
    if backend != "postgres":
        pytest.skip("statistics and cached plans are PostgreSQL's")
    import psycopg

    probe = psycopg.connect(store_url, autocommit=True)
    _no_autovacuum(probe)
    writer = psycopg.connect(store_url)
    try:
        writer.execute(
            "INSERT INTO plunder_jobs (queue, task, run_at, created_at)"
            " SELECT 'default', 't', now(), now() FROM generate_series(1, 20000)"
        )
        assert store.job_stats_refresh() is False  # grown pages, rows not committed
        writer.commit()
        _counted(probe, 20_000, store)
        assert store.job_stats_refresh() is True
        row = probe.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'plunder_jobs'"
        ).fetchone()
        assert row is not None and row[0] >= 10_000  # statistics of the table as it is
    finally:
        writer.close()
        probe.close()


def test_new_statistics_once_the_live_rows_outgrow_those_a_vacuum_counted(
    store_url: str, backend: str
) -> None:
    """A VACUUM of a table emptied but for its last rows keeps its pages and counts almost
    no rows: by those statistics the table is empty, and a turn prepared then acknowledged
    its jobs by reading the whole primary key at every turn (turns three to seven times
    slower on 20,000 jobs). Refilled within the pages the VACUUM kept, the table never grew
    tenfold, so job_stats_refresh took no new statistics until autovacuum did. It takes
    them once the live rows the server counts outgrow tenfold the rows the statistics
    counted; the turns then read the primary key about once per job."""
    if backend != "postgres":
        pytest.skip("statistics and cached plans are PostgreSQL's")
    import psycopg

    probe = psycopg.connect(store_url, autocommit=True)
    _no_autovacuum(probe)
    turns = open_store(store_url, pool_size=1)  # one connection: the one that prepares

    def table() -> tuple[int, int, int]:
        row = probe.execute(
            "SELECT c.relpages, pg_relation_size(c.oid) / 8192, coalesce(s.n_live_tup, 0)"
            " FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid"
            " WHERE c.relname = 'plunder_jobs'"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def counted(column: str, rows: int) -> None:
        """Wait until the server's statistics count ``rows`` in ``column``: a connection
        reports its rows after its transactions, a moment later."""
        deadline = time.monotonic() + 15
        sql = f"SELECT {column} FROM pg_stat_user_tables WHERE relname = 'plunder_jobs'"
        while (row := probe.execute(sql).fetchone()) is None or row[0] < rows:
            assert time.monotonic() < deadline, f"the server never counted {rows} {column}"
            time.sleep(0.2)
            turns.job_list(limit=1)
            probe.execute("SELECT pg_stat_clear_snapshot()")

    try:
        turns.job_enqueue_ids([JobSpec("t", [i], queue="old") for i in range(5_000)])
        probe.execute("DELETE FROM plunder_jobs WHERE id < (SELECT max(id) FROM plunder_jobs)")
        # both counted before the VACUUM: a late report would undo the rows it counts
        counted("n_tup_ins", 5_000)
        counted("n_tup_del", 4_999)
        probe.execute("VACUUM plunder_jobs")
        kept, _, _ = table()
        assert kept > GROWTH_FLOOR_PAGES  # the pages stay, the rows counted are one
        session = open_session(turns)

        def turn(done: list[JobRecord]) -> list[JobRecord]:
            exchange = turns.job_exchange_many(
                [Completion(j.claim, None) for j in done], [], session_id=session.id,
                queues=["default"], tasks=["t"], limit=100,
            )  # fmt: skip
            assert len(exchange.completed.accepted) == len(done)
            return list(exchange.claimed)

        assert turn([]) == []  # prepared while the statistics count one row
        assert turns.job_stats_refresh() is False  # the table is what they counted
        turns.job_enqueue_ids([JobSpec("t", [i]) for i in range(5_000)])
        counted("n_live_tup", 5_000)
        _, pages, _ = table()
        assert pages <= 2 * kept  # refilled within its pages: no tenfold growth
        assert turns.job_stats_refresh() is True
        assert turns.job_stats_refresh() is False  # its statistics see the table as it is
        claimed = turn([])
        assert len(claimed) == 100
        keys, scanned = _counters(probe, lambda: turns.job_list(limit=1))
        assert len(turn(claimed)) == 100  # a hundred acknowledged, a hundred claimed
        keys_after, scanned_after = _counters(probe, lambda: turns.job_list(limit=1))
    finally:
        turns.close()
        probe.close()
    assert scanned_after - scanned == 0
    assert keys_after - keys <= 2 * (200 + 1), keys_after - keys


def test_a_claim_steps_once_over_the_jobs_claimed_before_it(
    store: Store, store_url: str, backend: str
) -> None:
    """The entries of jobs claimed since the last VACUUM stay at the head of their level in
    plunder_jobs_claim, and while an older transaction is open (another worker's turn, a
    long report) the server cannot even mark them dead: every claim reads them, one heap
    look each. A prepared claim reads them once, to find the level's first job, and walks
    the level from there: not a second time. Its generic plan walks plunder_jobs_claim, not
    an index of every queue's pending jobs by run_at (the server's counters of the index)."""
    if backend != "postgres":
        pytest.skip("index entries of rows that are gone are PostgreSQL's (MVCC)")
    import psycopg

    store.job_enqueue_ids([JobSpec("t", [i], queue="other") for i in range(5_000)])
    store.job_enqueue_ids([JobSpec("t", [i], queue="mine") for i in range(4_000)])
    probe = psycopg.connect(store_url, autocommit=True)
    probe.execute("ANALYZE plunder_jobs")
    old = psycopg.connect(store_url)  # a snapshot older than every claim below
    old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    old.execute("SELECT count(*) FROM plunder_jobs").fetchone()
    claims, take, _ = _prepared_claims(store_url, probe)
    try:
        assert sum(take(100) for _ in range(20)) == 2_000  # prepared, 2,000 claimed before
        read, _ = _counters(probe, lambda: take(1), index="plunder_jobs_claim")
        assert sum(take(20) for _ in range(5)) == 100
        read_after, _ = _counters(probe, lambda: take(1), index="plunder_jobs_claim")
    finally:
        claims.close()
        old.rollback()
        old.close()
        probe.close()
    # five claims of 20 and the one that ended their transaction, each behind about 2,000
    # entries of claimed jobs: once is 6 x ~2,050, twice would be 6 x ~4,100
    entries = read_after - read
    assert 6 * 2_000 <= entries <= 6 * 2_200, entries
