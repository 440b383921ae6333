"""One exception hierarchy for plunder.

Every class's docstring is its default message. Only the store drivers catch
``sqlite3`` / ``psycopg`` errors, and they re-raise one of these ``from`` the original.
"""

from __future__ import annotations

from typing import Any


class PlunderError(Exception):
    """A plunder error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(PlunderError):
    """The configuration is invalid."""


class PayloadError(PlunderError, ValueError):
    """The payload cannot be stored as JSON."""


class InvalidName(PlunderError, ValueError):
    """The name is not valid."""


class UnknownTask(PlunderError):
    """No task is registered under that name."""


class JobNotFound(PlunderError, LookupError):
    """No job has that id."""


class InvalidTransition(PlunderError):
    """The job is not in a state that allows this change."""


class StaleClaim(PlunderError):
    """The claim is no longer current: the job was re-claimed, finished, or its session expired.

    Whatever the stale holder wanted to write has been discarded.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: int | None = None,
        attempt: int | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.attempt = attempt
        self.session_id = session_id


class SessionGone(PlunderError):
    """The worker session has expired or was closed; its claims have been or will be released."""


class LimitPaused(PlunderError):
    """The task paused a limit key (Context.pause_limit) and its job went back to wait for
    the pause to end, without spending an attempt; raised to end the task."""


class StaleLease(PlunderError):
    """The lease is no longer held under this term; the write was refused."""


class AccessDenied(PlunderError):
    """The gateway refused the API key: missing, wrong, revoked, expired, or not allowed
    to do this."""


class StoreError(PlunderError):
    """The store failed."""


class StoreBusy(StoreError):
    """The database stayed busy (locked, serialization failures, lost connection) too long."""


class StoreUnavailable(StoreError):
    """The database cannot be reached."""


class StoreRefused(StoreUnavailable):
    """The database refused this client for good (failed authentication, no such database
    or role): trying again cannot help."""


class OutcomeUnknown(StoreError):
    """The connection was lost while the database committed a write that is not safe to
    repeat (an enqueue without idempotency keys): it may or may not have been stored.
    Enqueue with ``key=`` to make a retry safe."""


class StoreFull(StoreError):
    """The database has no room left to write (disk full or file size limit)."""


class SchemaError(StoreError):
    """The database schema does not match this version of plunder."""


class JobFailed(PlunderError):
    """The job failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: int | None = None,
        status: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status
        self.error = error or {}

    @property
    def error_type(self) -> str | None:
        return self.error.get("type")

    @property
    def traceback(self) -> str | None:
        return self.error.get("traceback")


class InvalidSchedule(PlunderError, ValueError):
    """The schedule is not valid."""


class ScheduleNotFound(PlunderError, LookupError):
    """There is no schedule of that name."""
