"""The Django tasks backend, in process, on SQLite and PostgreSQL (two Django databases,
one task backend each): the framework's backend expectations that apply, jobs run by
plunder.testing.run_until_idle, and enqueues that join the caller's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

pytest.importorskip("django")

from plunder import testing
from tests.support import pgcluster

ALIASES = ["default", "pg"]


@pytest.fixture(scope="module")
def django_setup(tmp_path_factory: pytest.TempPathFactory, pg_cluster: pgcluster.Cluster) -> Any:
    import psycopg
    from django.conf import settings

    if settings.configured:
        pytest.skip("Django is configured already in this process")
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute('CREATE DATABASE "django_backend"')
    from urllib.parse import urlsplit

    parts = urlsplit(pg_cluster.url("django_backend"))
    sqlite_file = tmp_path_factory.mktemp("django") / "django.db"
    settings.configure(
        USE_TZ=True,
        INSTALLED_APPS=["django.contrib.contenttypes", "plunder.contrib.django"],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(sqlite_file)},
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "django_backend",
                "USER": parts.username or "",
                "HOST": parts.hostname,
                "PORT": str(parts.port),
            },
        },
        TASKS={
            alias: {
                "BACKEND": "plunder.contrib.django.PlunderBackend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {
                    "DATABASE": alias,
                    "TASK_OPTIONS": {"retries": 1, "backoff_base": 0},
                },
            }
            for alias in ALIASES
        },
    )
    import django
    from django.core.management import call_command

    django.setup()
    for alias in ALIASES:
        call_command("migrate", database=alias, verbosity=0)
    from tests.integrations import djtasks

    return djtasks


@pytest.fixture(params=ALIASES)
def alias(request: pytest.FixtureRequest, django_setup: Any) -> Iterator[str]:
    yield str(request.param)
    from django.db import connections

    connections.close_all()


def backend_of(alias: str) -> Any:
    from plunder.contrib.django import compat

    return compat.task_backends[alias]


def on(task: Any, alias: str) -> Any:
    return task.using(backend=alias)


def run(alias: str) -> testing.Ran:
    return testing.run_until_idle(backend_of(alias).app)


def test_enqueue_run_and_read_the_result(alias: str, django_setup: Any) -> None:
    from plunder.contrib.django import compat

    result = on(django_setup.add, alias).enqueue(2, b=3)
    assert result.status == compat.TaskResultStatus.READY
    assert result.backend == alias and result.args == [2] and result.kwargs == {"b": 3}
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    assert backend_of(alias).get_result(result.id).status == compat.TaskResultStatus.READY
    run(alias)
    result.refresh()
    assert result.status == compat.TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == 5 and result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at and result.errors == []
    assert on(django_setup.add, alias).get_result(result.id).return_value == 5


def test_a_failure_records_each_attempt_error(alias: str, django_setup: Any) -> None:
    from plunder.contrib.django import compat

    result = on(django_setup.fails, alias).enqueue("out of stock")
    run(alias)
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED
    assert result.attempts == 2  # TASK_OPTIONS retries=1
    assert [e.exception_class for e in result.errors] == [ValueError, ValueError]
    assert "out of stock" in result.errors[-1].traceback
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_takes_context(alias: str, django_setup: Any) -> None:
    result = on(django_setup.with_context, alias).enqueue("t")
    run(alias)
    assert backend_of(alias).get_result(result.id).return_value == {
        "id": result.id,
        "attempt": 1,
        "tag": "t",
    }


def test_priority_orders_the_runs(alias: str, django_setup: Any) -> None:
    django_setup.ran.clear()
    on(django_setup.noted, alias).enqueue("low")
    on(django_setup.noted.using(priority=50), alias).enqueue("high")
    run(alias)
    assert django_setup.ran == ["high", "low"]


def test_run_after_defers_the_job(alias: str, django_setup: Any) -> None:
    from django.utils import timezone

    from plunder.contrib.django import compat

    later = on(django_setup.add.using(run_after=timezone.now() + timedelta(hours=1)), alias)
    deferred = later.enqueue(1, 1)
    now = on(django_setup.add.using(run_after=timezone.now() - timedelta(seconds=1)), alias)
    due = now.enqueue(2, 2)
    run(alias)
    assert backend_of(alias).get_result(deferred.id).status == compat.TaskResultStatus.READY
    assert backend_of(alias).get_result(due.id).return_value == 4
    record = backend_of(alias).app.store.job_get(int(deferred.id))
    assert timedelta(minutes=59) < record.run_at - record.created_at <= timedelta(hours=1)


def test_queues_are_honoured_and_checked(alias: str, django_setup: Any) -> None:
    from plunder.contrib.django import compat

    result = on(django_setup.shout, alias).enqueue("hey")  # an async task, queue "emails"
    assert backend_of(alias).app.store.job_get(int(result.id)).queue == "emails"
    run(alias)
    assert backend_of(alias).get_result(result.id).return_value == "HEY"
    with pytest.raises(compat.InvalidTask, match="Queue 'nope'"):
        django_setup.add.using(queue_name="nope", backend=alias)


def test_aenqueue_and_aget_result(alias: str, django_setup: Any) -> None:
    async def go() -> Any:
        result = await on(django_setup.add, alias).aenqueue(20, 22)
        return await backend_of(alias).aget_result(result.id)

    result = asyncio.run(go())
    assert result.backend == alias and result.task.backend == alias
    run(alias)
    result.refresh()
    assert result.return_value == 42


def test_a_result_refreshes_from_its_own_backend(alias: str, django_setup: Any) -> None:
    # the same job id on both databases: a result read from one backend refreshes from
    # that backend, never from the task's default one (which holds another job by that id)
    other = next(a for a in ALIASES if a != alias)
    mine = on(django_setup.add, alias).enqueue(20, 22)
    theirs = on(django_setup.shout, other).enqueue("hey")
    for _ in range(10_000):
        if int(mine.id) == int(theirs.id):
            break
        if int(mine.id) < int(theirs.id):
            mine = on(django_setup.add, alias).enqueue(20, 22)
        else:
            theirs = on(django_setup.shout, other).enqueue("hey")
    assert mine.id == theirs.id
    run(other)
    result = backend_of(alias).get_result(mine.id)
    assert result.backend == alias and result.task.backend == alias
    run(alias)
    result.refresh()
    assert result.return_value == 42


def test_unknown_and_mismatched_results(alias: str, django_setup: Any) -> None:
    from plunder.contrib.django import compat

    for bad in ("999999999", "not-a-number"):
        with pytest.raises(compat.ResultDoesNotExist):
            backend_of(alias).get_result(bad)
    result = on(django_setup.add, alias).enqueue(1, 2)
    with pytest.raises(compat.exceptions.TaskResultMismatch):
        on(django_setup.fails, alias).get_result(result.id)


def test_enqueue_joins_the_callers_transaction(alias: str, django_setup: Any) -> None:
    from django.db import transaction

    from plunder.contrib.django import compat

    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        rolled_back = on(django_setup.add, alias).enqueue(1, 1)
        raise RuntimeError("the caller's transaction rolls back")
    with pytest.raises(compat.ResultDoesNotExist):
        backend_of(alias).get_result(rolled_back.id)
    with transaction.atomic(using=alias):
        kept = on(django_setup.add, alias).enqueue(3, 3)
    assert backend_of(alias).get_result(kept.id).status == compat.TaskResultStatus.READY


def test_arguments_json_cannot_carry_are_refused(alias: str, django_setup: Any) -> None:
    with pytest.raises(TypeError):
        on(django_setup.add, alias).enqueue(object(), 1)


def test_a_job_of_no_django_task_is_no_result(alias: str, django_setup: Any) -> None:
    from plunder.contrib.django import compat

    app = backend_of(alias).app
    job = app.enqueue("not.a.django.task", [1], allow_unregistered=True)
    with pytest.raises(compat.ResultDoesNotExist):
        backend_of(alias).get_result(str(job.id))
    app.job(job.id).cancel()  # so that run_until_idle's claims never meet it
