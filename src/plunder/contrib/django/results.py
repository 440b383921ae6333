"""plunder's job records as the tasks framework's TaskResult."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from plunder import errors
from plunder.contrib.django import compat
from plunder.model import JobRecord, Run
from plunder.states import Status

STATUS = {
    Status.PENDING: "READY",
    Status.RUNNING: "RUNNING",
    Status.SUCCEEDED: "SUCCESSFUL",
}  # every other status is an end that is not success: FAILED


def status_of(status: Status) -> Any:
    return compat.TaskResultStatus[STATUS.get(status, "FAILED")]


def ready(task: Any, result_id: str, args: list[Any], kwargs: dict[str, Any], alias: str) -> Any:
    """The TaskResult of a job just enqueued."""
    return compat.TaskResult(
        task=task,
        id=result_id,
        status=compat.TaskResultStatus.READY,
        enqueued_at=timezone.now(),
        started_at=None,
        last_attempted_at=None,
        finished_at=None,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=[],
        worker_ids=[],
    )


def task_of(record: JobRecord, alias: str) -> Any:
    """The Django task a job runs, with the job's queue and priority, on the backend
    ``alias`` that holds the job (``TaskResult.refresh`` reads the task's backend)."""
    try:
        task = import_string(record.task)
    except ImportError as exc:
        raise errors.UnknownTask(f"job {record.id}: cannot import task {record.task}") from exc
    if not isinstance(task, compat.Task):
        raise errors.UnknownTask(f"job {record.id}: {record.task} is not a Django task")
    return task.using(priority=record.priority, queue_name=record.queue, backend=alias)


def error_of(error: dict[str, Any]) -> Any:
    kind = str(error.get("type", "Exception"))
    path = kind if "." in kind else f"builtins.{kind}"
    return compat.TaskError(exception_class_path=path, traceback=str(error.get("traceback", "")))


def from_record(record: JobRecord, runs: Sequence[Run], alias: str) -> Any:
    """The TaskResult of a job: one worker id (a plunder session) and one error per
    attempt that ran and failed."""
    result = compat.TaskResult(
        task=task_of(record, alias),
        id=str(record.id),
        status=status_of(record.status),
        enqueued_at=record.created_at,
        started_at=runs[0].started_at if runs else record.started_at,
        last_attempted_at=runs[-1].started_at if runs else None,
        finished_at=record.finished_at,
        args=list(record.args),
        kwargs=dict(record.kwargs),
        backend=alias,
        errors=[error_of(run.error) for run in runs if run.error],
        worker_ids=[run.session_id for run in runs],
    )
    if record.status == Status.SUCCEEDED:
        object.__setattr__(result, "_return_value", record.result)
    elif not runs and record.error and record.status != Status.PENDING:
        result.errors.append(error_of(record.error))  # ended without running (expired)
    return result
