"""What result waiters are told on PostgreSQL: every job an acknowledgement completes is
named once on ``plunder_done`` when it commits, in notifications under the 8000-byte
limit, whether the acknowledgement is a statement on its own or part of a worker's turn;
a retried acknowledgement tells nobody again. A listener hears only the channels it asks
for, and a wait ends early when another thread interrupts it."""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plunder.model import Completion, JobSpec
from plunder.store import Store
from plunder.store.base import Notifications
from tests.store.helpers import claim, complete, enqueue, open_session, raw_connect

EVERY = ["plunder_enqueued", "plunder_done", "plunder_stream"]


@pytest.fixture
def notes(store: Store) -> Iterator[Notifications]:
    if not store.notifies:
        pytest.skip("SQLite has no NOTIFY: waiters watch data_version")
    listener = store.notifications(listen=True, application_name="test:listen")
    deadline = time.monotonic() + 10.0
    # connects, then its probe comes back and it LISTENs: "re-check everything"
    while ("*", "") not in listener.wait(0.2):
        assert time.monotonic() < deadline, "the listener never started listening"
    yield listener
    listener.close()


def told(notes: Notifications, count: int, timeout: float = 10.0) -> list[str]:
    """The payloads on plunder_done until ``count`` ids were named (or the timeout)."""
    payloads: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(len(p.split(",")) for p in payloads) < count and time.monotonic() < deadline:
        payloads += [p for channel, p in notes.wait(0.2) if channel == "plunder_done"]
    return payloads


def test_an_acknowledgement_names_each_job_it_completed_once(
    store: Store, notes: Notifications
) -> None:
    enqueue(store, *[JobSpec("t", [i]) for i in range(700)])
    jobs = claim(store, open_session(store), limit=700)
    done = [Completion(job.claim, job.args[0]) for job in jobs]
    assert len(store.job_complete_many(done).accepted) == 700
    payloads = told(notes, 700)
    assert all(len(p.encode()) < 8000 for p in payloads)
    assert sorted(int(i) for p in payloads for i in p.split(",")) == [j.id for j in jobs]
    # a retry after an ambiguous commit is accepted again, and nobody is told twice
    assert len(store.job_complete_many(done).accepted) == 700
    assert told(notes, 1, timeout=0.5) == []


def test_a_turn_names_the_jobs_it_completed(store: Store, notes: Notifications) -> None:
    enqueue(store, *[JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    first = claim(store, session, limit=2)
    turn = store.job_exchange_many(
        [Completion(job.claim, None) for job in first],
        [],
        session_id=session.id,
        queues=["default"],
        tasks=["t"],
        limit=2,
    )
    assert len(turn.completed.accepted) == 2 and len(turn.claimed) == 2
    assert sorted(int(i) for p in told(notes, 2) for i in p.split(",")) == [j.id for j in first]


def _listening(notes: Notifications) -> set[str]:
    return {row[0] for row in notes.connection.execute("SELECT pg_listening_channels()")}


def test_a_listener_hears_only_the_channels_it_asks_for(store: Store, notes: Notifications) -> None:
    work = ["plunder_enqueued"]
    assert notes.wait(0.0, work) == []
    assert _listening(notes) == {"plunder_enqueued"}
    enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]))
    first, second = claim(store, open_session(store), limit=2)
    assert complete(store, first.claim)
    heard: list[tuple[str, str]] = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        heard += notes.wait(0.1, work)
    assert ("plunder_enqueued", "default") in heard
    assert not [note for note in heard if note[0] != "plunder_enqueued"], heard
    # listened on anew: whatever it said before is lost, so "re-check", then what comes
    assert notes.wait(0.0, EVERY) == [("plunder_done", "*"), ("plunder_stream", "*")]
    assert _listening(notes) == set(EVERY)
    assert complete(store, second.claim)
    assert told(notes, 1) == [str(second.id)]
    with pytest.raises(ValueError, match="not plunder's channels"):
        notes.wait(0.0, ["plunder_enqueued", "pg_temp"])
    assert _listening(notes) == set(EVERY)


def test_an_interrupt_ends_a_wait_at_once(notes: Notifications) -> None:
    timer = threading.Timer(0.3, notes.interrupt)
    timer.start()
    started = time.monotonic()
    try:
        assert notes.wait(30.0) == []
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5.0
    notes.interrupt()  # before the wait: the next one ends at once
    started = time.monotonic()
    assert notes.wait(30.0) == []
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    assert notes.wait(0.2) == []  # and only that one: nothing is left pending
    assert time.monotonic() - started >= 0.15


def test_a_closed_listener_opens_no_connection(store_url: str, notes: Notifications) -> None:
    """A thread of its owner that outlives close() (a heartbeat that overran the wait for
    it) finds nothing to wait on, instead of a new connection nobody would close."""
    notes.close()
    notes.interrupt()
    assert notes.wait(0.1) == []
    conn = raw_connect(store_url)
    conn.autocommit = True
    deadline = time.monotonic() + 10.0
    try:
        while True:  # a closed backend leaves pg_stat_activity a moment later
            (count,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'test:listen'"
            ).fetchone()
            if count == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        conn.close()
    assert count == 0


def test_a_listener_works_with_descriptors_past_selects_limit(store: Store) -> None:
    """A busy process has many files open; select() refuses a descriptor past 1023."""
    if not store.notifies:
        pytest.skip("SQLite has no NOTIFY: waiters watch data_version")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    listener = store.notifications(listen=True, application_name="test:many-files")
    try:
        deadline = time.monotonic() + 10.0
        while ("*", "") not in listener.wait(0.2):
            assert time.monotonic() < deadline, "the listener never started listening"
        enqueue(store, JobSpec("t", [1]))
        heard: list[tuple[str, str]] = []
        while ("plunder_enqueued", "default") not in heard:
            assert time.monotonic() < deadline, heard
            heard += listener.wait(0.2)
        threading.Timer(0.2, listener.interrupt).start()
        started = time.monotonic()
        assert listener.wait(30.0) == []
        assert time.monotonic() - started < 5.0
    finally:
        listener.close()
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_interrupt_ends_a_wait_for_the_listen_probe(store: Store) -> None:
    """A fresh listening connection waits for its own probe notification before it trusts
    LISTEN (a transaction-mode pooler drops it); an interrupt ends that wait too, and the
    next wait goes on waiting for the probe."""
    if not store.notifies:
        pytest.skip("SQLite has no NOTIFY: waiters watch data_version")
    listener = store.notifications(listen=True, application_name="test:probe")
    try:
        listener.wait(0.0)  # connected; its probe sent, and perhaps back already
        # as if the probe never came back (a pooler): only its time, or an interrupt, ends it
        listener._probe = ("never-sent", time.monotonic() + 60)  # type: ignore[attr-defined]
        threading.Timer(0.2, listener.interrupt).start()
        started = time.monotonic()
        assert listener.wait(10.0) == []
        assert time.monotonic() - started < 5.0
        assert listener._probe is not None  # type: ignore[attr-defined]
    finally:
        listener.close()


def _heard(conn: Any, seconds: float) -> list[tuple[str, str]]:
    """What a plain LISTENing connection received within ``seconds``."""
    return [(n.channel, n.payload) for n in conn.notifies(timeout=seconds, stop_after=None)]


def test_nothing_is_notified_while_nobody_says_it_listens(store: Store, store_url: str) -> None:
    """A notifying commit holds a database-wide lock until its WAL is flushed, so plunder
    notifies on a channel only while a listening connection names it in
    plunder_listeners: a connection that merely LISTENs hears nothing, and hears every
    channel once a listener of plunder's names it."""
    if not store.notifies:
        pytest.skip("SQLite has no NOTIFY: waiters watch data_version")
    plain = raw_connect(store_url)
    plain.autocommit = True
    for channel in EVERY:
        plain.execute(f"LISTEN {channel}")
    listener = None
    try:
        enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]))
        session = open_session(store)
        first, second = claim(store, session, limit=2)
        assert complete(store, first.claim)
        assert _heard(plain, 0.5) == []

        listener = store.notifications(listen=True, application_name="test:listen")
        deadline = time.monotonic() + 10.0
        while ("*", "") not in listener.wait(0.2):
            assert time.monotonic() < deadline, "the listener never started listening"
        (row,) = plain.execute(
            "SELECT id, channels, expires_at > statement_timestamp() FROM plunder_listeners"
        ).fetchall()
        assert row[0].startswith("test:listen:") and sorted(row[1]) == sorted(EVERY) and row[2]
        assert complete(store, second.claim)
        enqueue(store, JobSpec("t", [3], queue="other"))
        heard = _heard(plain, 0.5)
        assert ("plunder_done", str(second.id)) in heard and ("plunder_enqueued", "other") in heard

        # a row that expired (its process died without a word) counts for nothing
        plain.execute("UPDATE plunder_listeners SET expires_at = statement_timestamp()")
        enqueue(store, JobSpec("t", [4], queue="more"))
        assert _heard(plain, 0.5) == []
    finally:
        if listener is not None:
            listener.close()
        plain.close()


def test_a_listener_names_its_channels_while_it_lives_and_not_after(
    store: Store, store_url: str, notes: Notifications, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row says what the connection LISTENs on, its expiry moves on at the waits that
    refresh it, and closing removes it (a listener that dies unannounced lapses instead)."""
    from plunder.store.postgres import notifications

    plain = raw_connect(store_url)
    plain.autocommit = True
    read = "SELECT channels, expires_at FROM plunder_listeners WHERE id LIKE 'test:listen:%'"
    try:
        ((channels, first),) = plain.execute(read).fetchall()
        assert sorted(channels) == sorted(EVERY)
        monkeypatch.setattr(notifications, "LISTENER_REFRESH", 0.0)  # from the next (re)naming on
        assert notes.wait(0.0, ["plunder_enqueued"]) == []
        ((channels, second),) = plain.execute(read).fetchall()
        assert channels == ["plunder_enqueued"] and second > first
        notes.wait(0.0, ["plunder_enqueued"])  # due: the same channels, a later expiry
        ((channels, third),) = plain.execute(read).fetchall()
        assert channels == ["plunder_enqueued"] and third > second
        (ttl,) = plain.execute(
            "SELECT extract(epoch FROM expires_at - statement_timestamp()) FROM plunder_listeners"
        ).fetchone()
        assert notifications.LISTENER_TTL - 5 < float(ttl) <= notifications.LISTENER_TTL
        notes.close()
        assert plain.execute(read).fetchall() == []
    finally:
        plain.close()
