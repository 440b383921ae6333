"""Frozen records that cross the store seam: what goes in (specs, claims, outcomes) and
what comes out (jobs, runs, sessions, leases, stats)."""

from __future__ import annotations

import traceback as traceback_module
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, make_dataclass
from datetime import datetime
from typing import Any, TypeVar

from plunder.states import Outcome, Status

# What a run records of an exception must always fit the payload limit, even if every
# character is escaped in the JSON (a control character takes six bytes).
MAX_ERROR_MESSAGE_CHARS = 16_000
MAX_ERROR_TRACEBACK_CHARS = 64_000
# A job lost with its worker this many times since it last ran to an outcome is a suspect.
# Twice, not once: most workers die of causes of their own (a deploy, the OOM killer, a
# lost machine), and the jobs of a worker that died once are rescued in parallel; a job
# that was running each time its worker died twice may be what kills them.
SUSPECT_LOSSES = 2

_Record = TypeVar("_Record")


def positional_builder(cls: type[_Record]) -> Callable[..., _Record]:
    """A fast positional constructor for the frozen slots dataclass ``cls``, for the hot
    paths that build thousands of records (claims, enqueues). A frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``, which for a JobRecord's 26
    fields costs about 7 µs; this fills a mutable twin with the same slots (plain stores,
    about 1 µs) and then makes it a ``cls``. The result is an ordinary, frozen ``cls``."""
    names = getattr(cls, "__slots__", None)
    if not names:
        raise TypeError(f"{cls.__name__} is not a slots dataclass")
    draft = make_dataclass(f"_{cls.__name__}Draft", names, slots=True, eq=False, repr=False)
    if draft.__slots__ != names:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: the draft's slots differ from the record's")

    def build(*values: Any) -> _Record:
        record = draft(*values)
        record.__class__ = cls
        return record  # type: ignore[no-any-return]

    build.__name__ = f"build_{cls.__name__}"
    return build


def _recordable(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` as a run can store it: lone surrogates (not Unicode, refused by every
    database) written as ``\\udXXX`` escapes, and at most ``limit`` characters kept — the
    start of a message, the end of a traceback."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    cut = f"[{len(text) - limit} characters cut]"
    return f"{cut} {text[-limit:]}" if keep_end else f"{text[:limit]} {cut}"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """What a failed run records: the exception's type, message and traceback."""

    type: str
    message: str
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        kind = type(exc)
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else (f"{kind.__module__}.{kind.__qualname__}")
        )
        try:
            message = str(exc)
        except Exception:  # a task's exception may fail even to print itself
            message = f"<{name} whose str() failed>"
        text = "".join(traceback_module.format_exception(exc))
        return cls(
            type=_recordable(name, MAX_ERROR_MESSAGE_CHARS),
            message=_recordable(message, MAX_ERROR_MESSAGE_CHARS),
            traceback=_recordable(text, MAX_ERROR_TRACEBACK_CHARS, keep_end=True),
        )

    def as_dict(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(
            type=str(data.get("type", "")),
            message=str(data.get("message", "")),
            traceback=str(data.get("traceback", "")),
        )


RATE_PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0,
                "h": 3600.0, "hour": 3600.0, "day": 86400.0}  # fmt: skip
MAX_LIMIT_KEY = 200  # characters


def rate_parts(rate: str) -> tuple[int, float]:
    """``"600/min"`` as (600, 60.0): how many per how many seconds; ValueError otherwise."""
    count, _, unit = str(rate).partition("/")
    period = RATE_PERIODS.get(unit.strip())
    if not count.strip().isdigit() or int(count) < 1 or period is None:
        raise ValueError(
            f"rate {rate!r} must read COUNT/UNIT with a positive COUNT and a UNIT of "
            f"{', '.join(RATE_PERIODS)} (e.g. '600/min')"
        )
    return int(count), period


@dataclass(frozen=True, slots=True)
class Limit:
    """A job's limit key and what its task declares of it: at most ``ceiling`` of the key's
    jobs running at once (None: no ceiling) and at most ``rate`` (``"600/min"``) started.
    A key's limit is made from the first job that names it; ``App.set_limit`` changes it."""

    key: str
    ceiling: int | None = None
    rate: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not 0 < len(self.key) <= MAX_LIMIT_KEY:
            raise ValueError(f"a limit key must be text of 1 to {MAX_LIMIT_KEY} characters")
        ceiling = self.ceiling
        if ceiling is not None and (
            isinstance(ceiling, bool) or not isinstance(ceiling, int) or ceiling < 1
        ):
            raise ValueError(f"limit {self.key!r}: the ceiling must be a positive integer")
        if self.rate is not None:
            rate_parts(self.rate)

    @classmethod
    def declared(cls, limit: Any, rate: Any) -> Limit | None:
        """The Limit of a task's ``limit=(key, ceiling)`` and ``rate=(key, "600/min")``
        (either may be None; both name the same key)."""
        if limit is None and rate is None:
            return None
        pairs = {"limit": limit, "rate": rate}
        for name, pair in pairs.items():
            if pair is not None and not (isinstance(pair, tuple | list) and len(pair) == 2):
                raise ValueError(f"{name} must be a (key, value) pair, not {pair!r}")
        keys = {pair[0] for pair in (limit, rate) if pair is not None}
        if len(keys) > 1:
            raise ValueError(f"limit and rate must name the same key, not {sorted(keys)}")
        return cls(
            keys.pop(),
            None if limit is None else limit[1],
            None if rate is None else rate[1],
        )


@dataclass(frozen=True, slots=True)
class LimitState:
    """A limit key as ``plunder status`` shows it: its ceiling and rate, its jobs running,
    admitted (pending, to be claimed) and held (pending, waiting for admission), and the
    end of its pause (None: not paused)."""

    key: str
    ceiling: int | None
    rate: str | None
    running: int
    admitted: int
    held: int
    paused_until: datetime | None

    @property
    def reason(self) -> str:
        """Why its held jobs wait (empty: none waits)."""
        if not self.held:
            return ""
        if self.paused_until is not None:
            return f"paused until {self.paused_until:%m-%d %H:%M:%S}"
        if self.ceiling is not None and self.running + self.admitted >= self.ceiling:
            return f"at its ceiling of {self.ceiling}"
        if self.rate is not None:
            return f"rate {self.rate}"
        return "waiting for admission"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to enqueue. ``delay`` is seconds after the database's ``now``; so is
    ``expires_in``, the start-by deadline (None: none; see plunder.task.Options)."""

    task: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    delay: float = 0.0
    max_attempts: int = 1
    timeout: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    retry_on_timeout: bool = True
    key: str | None = None
    retry_on_lost: bool = True
    expires_in: float | None = None
    limit: Limit | None = None
    # the rest: see plunder.task.Options, and docs/guide (partitions, fairness, affinity)
    partition_key: str | None = None
    ordered: bool | str = False
    group: str | None = None
    affinity: Mapping[str, str] | None = None
    require: Mapping[str, str] | None = None
    cost: int = 1


@dataclass(frozen=True, slots=True)
class Claim:
    """The fencing token: a worker's write about a job counts only while this is current."""

    job_id: int
    attempt: int
    session_id: str


@dataclass(frozen=True, slots=True)
class Completion:
    """A successful run. ``effects`` runs inside the acknowledging transaction with the
    driver's connection; its writes commit together with the acknowledgement or not at all."""

    claim: Claim
    result: Any = None
    logs: tuple[str, ...] = ()
    effects: Callable[[Any], None] | None = None
    # ``result`` as JSON text, where the caller already encoded (and so checked) it
    encoded: str | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed run. ``retry_delay`` is None when the job must not be retried; otherwise it
    is retried after that many seconds of database time if attempts remain."""

    claim: Claim
    error: ErrorInfo
    retry_delay: float | None = 0.0
    logs: tuple[str, ...] = ()
    outcome: Outcome = Outcome.FAILED


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One chunk or progress report written by a running attempt, or (kind "attempt") the
    mark that :meth:`plunder.Job.stream` puts before the first event of a new attempt:
    the previous attempt's events are void from there. A mark is not stored: its
    ``attempt`` is the new attempt, ``data`` is ``{"attempt": new, "previous": old}``,
    and its ``seq`` and ``created_at`` are those of the event it precedes. A stream whose
    job's last attempt streamed nothing ends with that attempt's mark, whose ``seq`` is the
    last event's and ``created_at`` the time the job finished."""

    job_id: int
    attempt: int
    seq: int
    kind: str  # "chunk" | "progress" | "attempt"
    data: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    status: Status
    attempt: int
    max_attempts: int
    timeout: float | None
    backoff_base: float
    backoff_cap: float
    retry_on_timeout: bool
    key: str | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    deadline_at: datetime | None
    session_id: str | None
    result: Any
    error: dict[str, Any] | None
    failed_sessions: tuple[str, ...]
    # How often its worker died while running it, since it last ran to an outcome.
    losses: int
    retry_on_lost: bool
    # The start-by deadline (expires_in): it bounds every start, a retry's too; None: none.
    expires_at: datetime | None
    # Its limit key (see Limit): while it is held, run_at is its due time plus HOLD.
    limit_key: str | None
    affinity: str | None  # the labels it prefers and requires ("{model=x}"): plunder.affinity
    require: str | None
    cost: int

    @property
    def claim(self) -> Claim:
        """The current claim; only meaningful while the job is running."""
        if self.session_id is None:
            raise ValueError(f"job {self.id} is not claimed")
        return build_claim(self.id, self.attempt, self.session_id)

    @property
    def suspect(self) -> bool:
        """Lost with its worker SUSPECT_LOSSES times in a row: it may be the job that killed
        those workers. A worker runs at most one suspect at a time."""
        return self.losses >= SUSPECT_LOSSES

    @property
    def attempts_left(self) -> int:
        return max(0, self.max_attempts - self.attempt)


# JobRecord(*values), fields in declaration order, at a sixth of the cost
build_job = positional_builder(JobRecord)
build_claim = positional_builder(Claim)  # asked for twice per job a worker runs
# Completion(claim, result, logs, effects, encoded): one per job a worker runs
build_completion = positional_builder(Completion)


@dataclass(frozen=True, slots=True)
class Run:
    """One attempt at a job."""

    job_id: int
    attempt: int
    session_id: str
    worker: str
    host: str
    pid: int
    started_at: datetime
    finished_at: datetime | None
    outcome: Outcome | None
    error: dict[str, Any] | None
    logs: tuple[str, ...]

    @property
    def duration(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    expiry: float
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    tasks: tuple[str, ...] = ()  # the tasks its worker runs
    free_slots: int = 0  # as of its last heartbeat
    key_id: str | None = None  # the API key that opened it through a gateway
    labels: tuple[str, ...] = ()  # its worker's labels, key=value (plunder.affinity)


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task as a worker publishes it when its session opens: its queue, pool and other
    enqueue options (JSON values by name), which an enqueue by name takes without its code."""

    name: str
    queue: str
    pool: str
    options: dict[str, Any]
    session_id: str | None = None  # the session that published it (read back)
    published_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Unrunnable:
    """Pending jobs of one task and queue that no live session can run: none lists both."""

    task: str
    queue: str
    pending: int
    require: str | None = None  # labels they require, which no live worker holds
    cost: int = 1  # their slots each: more than a live worker has, unless 1


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The store's answer to a session heartbeat.

    ``alive`` is False when the session had already expired or been closed: the worker must
    stop everything it runs. ``stop`` names the claims the worker reported that are no longer
    current (cancelled, timed out, re-claimed): their tasks should be stopped. ``unknown``
    names the jobs the database has running under this session that the worker did not
    report: claims whose answer was lost (a connection cut after the claim committed), or
    claims that changed hands while the report was on its way. The worker decides which.
    """

    alive: bool
    expires_at: datetime | None
    stop: tuple[Claim, ...] = ()
    unknown: tuple[Claim, ...] = ()
    # the session's queues as the database has them (changed by session_queues); None
    # where the answer does not say (a gateway older than this field)
    queues: tuple[str, ...] | None = None
    # each partitioned queue, with the partitions this session owns (None: not said)
    partitions: tuple[Partitioning, ...] | None = None


@dataclass(frozen=True, slots=True)
class PartitionedQueue:
    """A partitioned queue as the janitor last assigned it: the session owning each
    partition (None: no live session serves the queue)."""

    queue: str
    partitions: int
    generation: int
    owners: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Partitioning:
    """A partitioned queue as a session's heartbeat hears it: its partitions, the
    generation of its assignment, and those of its partitions the session owns."""

    queue: str
    partitions: int
    generation: int
    owned: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Lease:
    """A named lease; ``term`` grows at every change of holder and fences the holder's writes."""

    name: str
    holder: str
    term: int
    acquired_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    counts: dict[str, int]
    oldest_pending_age: float | None  # seconds, by the database clock

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a job listing; pass ``next_after`` back to get the next page."""

    jobs: tuple[JobRecord, ...]
    next_after: int | None


@dataclass(frozen=True, slots=True)
class AckResult:
    """What a batch acknowledgement did. ``accepted``: claims whose write committed.
    ``stale``: claims the fence refused (nothing of theirs was written). ``effect_errors``:
    completions whose ``effects`` raised; their transaction rolled back, so those jobs are
    still running and the caller should fail them."""

    accepted: tuple[Claim, ...]
    stale: tuple[Claim, ...]
    effect_errors: tuple[tuple[Claim, BaseException], ...] = ()


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one worker turn did in one transaction: acknowledged, then claimed
    (``children``: as plunder.protocol.Reply's)."""

    completed: AckResult
    failed: AckResult
    claimed: tuple[JobRecord, ...]
    children: bool = False


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one janitor pass changed."""

    retried: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()
    sessions: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.retried) + len(self.finished) + len(self.sessions)
