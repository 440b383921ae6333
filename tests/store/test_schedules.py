"""Schedules (plunder.store.schedules, plunder.schedules) on every backend: definitions
kept in the database, each tick enqueued once under the janitor's lease (a stale holder's
pass writes nothing; a takeover neither skips nor repeats), the catch-up policies, pauses,
and daily ticks across Europe/Paris's daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from plunder import errors
from plunder.config import Settings
from plunder.cron import Schedule, ScheduleSpec
from plunder.janitor import Janitor
from plunder.model import JobSpec, Lease
from plunder.schedules import Ticker
from plunder.store import Store
from tests.store.helpers import later, open_session

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # a minute's start, for round ticks


def every_second(name: str = "beat", **options: object) -> ScheduleSpec:
    return ScheduleSpec(name, "t", "* * * * * *", **options)  # type: ignore[arg-type]


def make(schedule: Schedule, tick: datetime) -> JobSpec:
    return JobSpec(schedule.task, list(schedule.args), queue=schedule.queue or "default")


def lease_of(store: Store, holder: str, now: datetime, ttl: float = 5) -> Lease:
    lease = store.lease_acquire("plunder.janitor", holder, ttl, now=now)
    assert lease is not None
    return lease


def keys(store: Store) -> list[str]:
    jobs = store.job_list(limit=1000).jobs
    return sorted(j.key for j in jobs if j.key is not None)


def key(name: str, at: datetime) -> str:
    return f"plunder.schedule:{name}@{at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


def test_a_schedule_is_stored_and_changed_without_losing_its_place(store: Store) -> None:
    made = store.schedule_upsert(
        every_second(args=[1, "a"], queue="q", catch_up="all", timezone="Europe/Paris"),
        now=T0,
    )
    assert made.next_at == later(T0, 1) and not made.paused and made.last_at is None
    assert (made.args, made.queue, made.catch_up, made.timezone) == (
        [1, "a"],
        "q",
        "all",
        "Europe/Paris",
    )
    assert store.schedule_get("beat") == made
    assert store.schedule_list() == [made]
    # the same definition again changes nothing; new args keep the next tick
    same = every_second(args=[1, "a"], queue="q", catch_up="all", timezone="Europe/Paris")
    assert store.schedule_upsert(same, now=later(T0, 30)) == made
    moved = store.schedule_upsert(
        every_second(args=[2], timezone="Europe/Paris"), now=later(T0, 30)
    )
    assert moved.args == [2] and moved.next_at == made.next_at and moved.queue is None
    assert moved.catch_up == "latest"  # the default
    # a new cron ticks first after now
    hourly = store.schedule_upsert(ScheduleSpec("beat", "t", "0 * * * *"), now=later(T0, 30))
    assert hourly.next_at == T0 + timedelta(hours=1)


def test_bad_definitions_and_unknown_names_are_refused(store: Store) -> None:
    with pytest.raises(
        errors.InvalidSchedule, match="invalid cron expression '61 \\* \\* \\* \\*'"
    ):
        store.schedule_upsert(ScheduleSpec("x", "t", "61 * * * *"))
    with pytest.raises(errors.InvalidSchedule, match="unknown time zone 'Europe/Pariss'"):
        store.schedule_upsert(ScheduleSpec("x", "t", "* * * * *", timezone="Europe/Pariss"))
    with pytest.raises(errors.ScheduleNotFound, match="no schedule named 'nope'"):
        store.schedule_get("nope")
    with pytest.raises(errors.ScheduleNotFound, match="no schedule named 'nope'"):
        store.schedule_pause("nope", True)
    assert store.schedule_remove("nope") is False
    assert store.schedule_list() == []


def test_each_tick_is_enqueued_once_with_its_key(store: Store) -> None:
    store.schedule_upsert(every_second(args=[7], queue="q"), now=T0)
    lease = lease_of(store, "a", later(T0, 3.5))
    ticks = store.schedule_tick_many(lease, make, now=later(T0, 3.5))
    assert [t.at for t in ticks] == [later(T0, s) for s in (1, 2, 3)]
    assert store.schedule_tick_many(lease, make, now=later(T0, 3.9)) == []
    jobs = {store.job_get(t.job_id).key: store.job_get(t.job_id) for t in ticks}
    assert sorted(jobs) == [key("beat", later(T0, s)) for s in (1, 2, 3)]
    assert {(j.queue, tuple(j.args)) for j in jobs.values()} == {("q", (7,))}
    after = store.schedule_get("beat")
    assert after.next_at == later(T0, 4) and after.last_at == later(T0, 3)
    assert after.last_job_id == ticks[-1].job_id


def test_a_stale_holder_writes_nothing_and_the_new_one_skips_nothing(store: Store) -> None:
    """The first holder enqueues ticks 1-2, pauses past its lease; the second takes over
    and enqueues 3-6; the first wakes and its pass is refused whole."""
    store.schedule_upsert(every_second(), now=T0)
    first = lease_of(store, "a", later(T0, 2.5), ttl=2)
    assert len(store.schedule_tick_many(first, make, now=later(T0, 2.5))) == 2
    second = lease_of(store, "b", later(T0, 6.5), ttl=2)
    assert second.term == first.term + 1
    with pytest.raises(errors.StaleLease):
        store.schedule_tick_many(first, make, now=later(T0, 6.6))
    assert keys(store) == [key("beat", later(T0, s)) for s in (1, 2)]
    assert [t.at for t in store.schedule_tick_many(second, make, now=later(T0, 6.6))] == [
        later(T0, s) for s in (3, 4, 5, 6)
    ]
    assert keys(store) == [key("beat", later(T0, s)) for s in range(1, 7)]


@pytest.mark.parametrize(
    ("catch_up", "enqueued"),
    [
        ("all", list(range(1, 601))),  # ten minutes of seconds, all of them
        ("latest", [540, *range(541, 601)]),  # the newest missed tick, then the last minute
        ("none", list(range(541, 601))),  # only the ticks late by less than the grace
    ],
)
def test_catch_up_after_everything_was_down(
    store: Store, catch_up: str, enqueued: list[int]
) -> None:
    store.schedule_upsert(every_second(catch_up=catch_up), now=T0)
    lease = lease_of(store, "a", later(T0, 600), ttl=60)
    ticks = store.schedule_tick_many(lease, make, now=later(T0, 600), grace=60)
    assert [t.at for t in ticks] == [later(T0, s) for s in sorted(set(enqueued))]
    assert store.schedule_get("beat").next_at == later(T0, 601)


def test_pause_and_resume(store: Store) -> None:
    store.schedule_upsert(every_second(catch_up="all"), now=T0)
    lease = lease_of(store, "a", T0, ttl=600)
    assert store.schedule_pause("beat", True, now=later(T0, 0.5)).paused
    assert store.schedule_tick_many(lease, make, now=later(T0, 10)) == []
    # a deploy that declares it again keeps the pause
    assert store.schedule_upsert(every_second(catch_up="all"), now=later(T0, 10)).paused
    resumed = store.schedule_pause("beat", False, now=later(T0, 20.5))
    assert not resumed.paused and resumed.next_at == later(T0, 21)
    ticks = store.schedule_tick_many(lease, make, now=later(T0, 22.5))
    assert [t.at for t in ticks] == [later(T0, 21), later(T0, 22)]  # nothing of the pause
    assert store.schedule_remove("beat") is True
    assert store.schedule_list() == []
    assert store.schedule_tick_many(lease, make, now=later(T0, 30)) == []


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        # 29 March 2026: 02:30 does not exist; the job runs at 03:00 (01:00 UTC)
        (
            (2026, 3, 27, 12),
            ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        ),
        # 25 October 2026: 02:30 happens twice; the job runs once, at the first
        (
            (2026, 10, 23, 12),
            ["2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
    ],
)
def test_a_daily_paris_schedule_across_daylight_saving(
    store: Store, start: tuple[int, ...], expected: list[str]
) -> None:
    t0 = datetime(*start, tzinfo=ZoneInfo("Europe/Paris")).astimezone(UTC)
    store.schedule_upsert(
        ScheduleSpec("daily", "t", "30 2 * * *", timezone="Europe/Paris", catch_up="all"), now=t0
    )
    lease = lease_of(store, "a", t0, ttl=10 * 86400)
    for hours in range(3 * 24):  # a pass every hour for three days
        store.schedule_tick_many(lease, make, now=t0 + timedelta(hours=hours))
    assert keys(store) == [f"plunder.schedule:daily@{at}" for at in expected]


def test_the_janitor_enqueues_ticks_with_the_tasks_published_options(store: Store) -> None:
    """A worker published task t with retries; the janitor's tick job takes them."""
    from plunder.model import TaskInfo

    store.session_open(
        name="w", host="h", pid=1, queues=["jobs"], expiry=30, now=T0,
        tasks=[TaskInfo("t", "jobs", "thread", {"retries": 2, "timeout": 9.0})],
    )  # fmt: skip
    store.schedule_upsert(every_second(args=[1]), now=T0)
    store.schedule_upsert(every_second("other", queue="elsewhere"), now=T0)
    janitor = Janitor(store, Settings(url="sqlite:///unused.db"))
    done = janitor.run_once(now=later(T0, 1.5))
    assert sorted((t.schedule, t.at) for t in done.ticks) == [
        ("beat", later(T0, 1)),
        ("other", later(T0, 1)),
    ]
    jobs = {t.schedule: store.job_get(t.job_id) for t in done.ticks}
    assert (jobs["beat"].queue, jobs["beat"].max_attempts, jobs["beat"].timeout) == ("jobs", 3, 9.0)
    assert jobs["other"].queue == "elsewhere"
    assert janitor.run_once(now=later(T0, 1.6)).ticks == ()


def test_two_tickers_racing_enqueue_each_tick_once(store: Store) -> None:
    """Even two processes that both believe they hold the lease (the fence is the second
    guard) cannot enqueue a tick twice: next_at moves by compare-and-set."""
    import threading

    store.schedule_upsert(every_second(catch_up="all"), now=T0)
    lease = lease_of(store, "a", T0, ttl=3600)
    errors_seen: list[BaseException] = []

    def tick(offset: float) -> None:
        try:
            for step in range(20):
                store.schedule_tick_many(lease, make, now=later(T0, offset + step))
        except BaseException as exc:
            errors_seen.append(exc)

    threads = [threading.Thread(target=tick, args=(o,)) for o in (0.3, 0.6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors_seen == []
    assert keys(store) == sorted(key("beat", later(T0, s)) for s in range(1, 20))


def test_the_ticker_does_not_write_when_nothing_is_due(store: Store) -> None:
    store.schedule_upsert(ScheduleSpec("hourly", "t", "0 * * * *"), now=T0)
    lease = lease_of(store, "a", T0, ttl=3600)
    assert Ticker().run_once(store, lease, now=later(T0, 60)) == []
    assert open_session(store, now=T0) is not None


def test_an_apps_schedules_are_declared_and_keep_a_pause(store_url: str, store: Store) -> None:
    import plunder

    app = plunder.App(store_url)
    try:

        @app.periodic("*/5 * * * *", queue="clock", args=[1], timezone="Europe/Paris", name="tick")
        def tick(n: int) -> int:
            return n

        @app.task(queue="reports", name="report")
        def report(kind: str) -> str:
            return kind

        spec = app.schedule(report, cron="0 7 * * *", args=["daily"], name="morning")
        assert (spec.queue, spec.catch_up, spec.task) == ("reports", "latest", report.name)
        assert app.schedule(report, cron="0 7 * * *", args=["daily"], name="morning") == spec
        with pytest.raises(errors.InvalidSchedule, match="two different schedules"):
            app.schedule(report, cron="0 8 * * *", name="morning")
        with pytest.raises(errors.InvalidSchedule, match="Bad minute"):
            app.schedule(report, cron="99 * * * *", name="bad")
        with pytest.raises(errors.InvalidSchedule, match="catch_up must be one of"):
            app.periodic("* * * * *", catch_up="sometimes", name="x1")(lambda: None)
        assert "x1" not in app.registry
        with pytest.raises(TypeError, match="unknown task option"):
            app.periodic("* * * * *", colour="red", name="x2")(lambda: None)

        declared = {s.name: s for s in app.declare_schedules()}
        assert set(declared) == {"tick", "morning"} and tick.name == "tick"
        assert (declared[tick.name].queue, declared[tick.name].args) == ("clock", [1])
        assert declared[tick.name].timezone == "Europe/Paris"
        store.schedule_pause("morning", True)
        assert {s.name: s.paused for s in app.declare_schedules()} == {
            tick.name: False,
            "morning": True,
        }
    finally:
        app.close()


def test_a_schedule_gone_bad_in_the_database_does_not_stop_the_others(store: Store) -> None:
    """A row whose cron or zone no longer reads (edited by hand, a zone gone from the
    system's tzdata) is skipped with an error in the log; the others tick."""
    store.schedule_upsert(every_second("bad"), now=T0)
    store.schedule_upsert(every_second("good"), now=T0)
    with store.transaction() as conn:
        conn.execute("UPDATE plunder_schedules SET timezone = 'Nowhere/City' WHERE name = 'bad'")
    lease = lease_of(store, "a", T0, ttl=600)
    ticks = store.schedule_tick_many(lease, make, now=later(T0, 1.5))
    assert [(t.schedule, t.at) for t in ticks] == [("good", later(T0, 1))]
    assert store.schedule_get("bad").next_at == later(T0, 1)
