"""Published tasks: a session publishes the tasks its worker serves (the last one wins),
and the pending jobs that no live session can run are counted by task and queue."""

from __future__ import annotations

from plunder.model import JobSpec, TaskInfo, Unrunnable
from plunder.store import Store
from tests.store.helpers import enqueue, later, open_session


def test_a_session_publishes_its_tasks_and_the_last_one_wins(store: Store) -> None:
    options = {"timeout": 1.0, "retries": 0, "priority": 3, "backoff_cap": 9.5}
    first = store.session_open(
        name="w1",
        host="h",
        pid=1,
        queues=["llm"],
        expiry=30,
        tasks=[
            TaskInfo("mod.slow", "llm", "process", options),
            TaskInfo("mod.fast", "llm", "thread", {}),
        ],
        free_slots=2,
    )
    assert first.tasks == ("mod.fast", "mod.slow") and first.free_slots == 2
    slow = store.task_get("mod.slow")
    assert slow is not None
    assert (slow.name, slow.queue, slow.pool, slow.options) == (
        "mod.slow",
        "llm",
        "process",
        options,
    )
    assert slow.session_id == first.id and slow.published_at is not None
    assert store.task_get("mod.never") is None
    assert store.task_get("not a task name!") is None

    second = open_session(store, queues=["other"], tasks=["mod.slow"])
    again = store.task_get("mod.slow")
    assert again is not None and (again.queue, again.options) == ("other", {})
    assert again.session_id == second.id
    assert [t.name for t in store.task_list()] == ["mod.fast", "mod.slow"]
    assert [s.tasks for s in store.session_list()] == [("mod.fast", "mod.slow"), ("mod.slow",)]


def test_pending_jobs_no_live_session_can_run_are_counted_by_task(store: Store) -> None:
    now = store.now()
    enqueue(
        store,
        JobSpec("t"),  # a live session serves its queue and task
        JobSpec("u"),  # the queue, not the task
        JobSpec("u"),
        JobSpec("t", queue="elsewhere"),  # the task, not the queue
        now=now,
    )
    open_session(store, queues=["default"], tasks=["t"], expiry=10, now=now)
    assert store.job_unrunnable(now=now) == [
        Unrunnable("t", "elsewhere", 1),
        Unrunnable("u", "default", 2),
    ]
    # once the session has expired, no job can be run
    assert store.job_unrunnable(now=later(now, 11)) == [
        Unrunnable("t", "default", 1),
        Unrunnable("t", "elsewhere", 1),
        Unrunnable("u", "default", 2),
    ]
