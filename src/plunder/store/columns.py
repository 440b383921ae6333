"""The job's options and columns, declared once, and what is built from them.

``OPTIONS``: the enqueue options a JobSpec carries besides its arguments and key, each with
its check and the plunder_jobs column it sets. ``COLUMNS``: plunder_jobs' columns as a
JobRecord holds them, its fields in order, each of the kind its type says (how a driver's
value becomes the record's). Built from them: the validation of an enqueue
(``spec_settings``), the values a fresh job's record takes (``FreshJobs``) and the records
of job rows read back (``read_jobs``). The SQL keeps explicit column lists, which tests
check against this declaration.

A new option is a field of JobSpec and of plunder.task.Options, a line in OPTIONS and, if
it has a column of its own, a field of JobRecord; then the SQL (schema, migration, queries).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from plunder import access, affinity, errors, payload
from plunder.model import JobRecord, JobSpec, Limit, build_job
from plunder.states import Status
from plunder.store import convert

# (option name, its value, the spec it is of) -> the value checked, as the store binds it
Check = Callable[[str, Any, JobSpec], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class JobOption:
    """An enqueue option: the JobSpec field and the insert's parameter ``name``, its
    ``check``, and the ``column`` it sets, which holds the enqueue's time plus the option's
    seconds where ``relative`` (None seconds: NULL)."""

    name: str
    check: Check
    column: str
    relative: bool = False


def _named(check: Callable[[Any], Any]) -> Check:
    return lambda _name, value, _spec: check(value)


def _integer(low: int, high: int) -> Check:
    return lambda name, value, _spec: convert.integer(name, value, low, high)


def _seconds(check: Callable[[str, object], float], *, optional: bool = False) -> Check:
    def seconds(name: str, value: Any, _spec: JobSpec) -> float | None:
        return None if optional and value is None else check(name, value)

    return seconds


def _flag(_name: str, value: Any, _spec: JobSpec) -> bool:
    return bool(value)


def _start_by(name: str, value: Any, spec: JobSpec) -> float | None:
    """A start-by deadline (seconds after the enqueue) that leaves the job time to start."""
    if value is None:
        return None
    seconds = convert.positive(name, value)
    if seconds <= convert.non_negative("delay", spec.delay):
        raise ValueError(
            f"{name} ({value!r}s) must be longer than delay ({spec.delay!r}s): "
            "the job would expire before it is due"
        )
    return seconds


def _limit_key(name: str, value: Any, _spec: JobSpec) -> str | None:
    """A Limit's key, which the job's limit_key column holds (its ceiling and rate go to
    the key's limit, see plunder.store.limits)."""
    if value is None or isinstance(value, Limit):
        return None if value is None else value.key
    raise ValueError(f"{name} must be a plunder Limit or None, not {type(value).__name__}")


def _group(_name: str, value: Any, _spec: JobSpec) -> str | None:
    """A job's group (a tenant; docs/guide/fairness.md), named as a key's group is."""
    return None if value is None else access.check_group(value)


def _labels(name: str, value: Any, _spec: JobSpec) -> str | None:
    return affinity.stored(name, value)


# In the order they are checked: the first bad one is the one an enqueue names.
OPTIONS: tuple[JobOption, ...] = (
    JobOption("queue", _named(payload.check_stored_queue), "queue"),
    JobOption("task", _named(payload.check_task), "task"),
    JobOption("priority", _integer(-convert.INT32, convert.INT32), "priority"),
    JobOption("max_attempts", _integer(1, 1000), "max_attempts"),
    JobOption("timeout", _seconds(convert.positive, optional=True), "timeout"),
    JobOption("backoff_base", _seconds(convert.non_negative), "backoff_base"),
    JobOption("backoff_cap", _seconds(convert.non_negative), "backoff_cap"),
    JobOption("retry_on_timeout", _flag, "retry_on_timeout"),
    JobOption("delay", _seconds(convert.non_negative), "run_at", relative=True),
    JobOption("retry_on_lost", _flag, "retry_on_lost"),
    JobOption("expires_in", _start_by, "expires_at", relative=True),
    JobOption("limit", _limit_key, "limit_key"),
    JobOption("group", _group, "group_name"),
    JobOption("affinity", _labels, "affinity"),
    JobOption("require", _labels, "require"),
    JobOption("cost", _named(affinity.cost), "cost"),
)
OWN = ("args", "kwargs", "key")  # a JobSpec's values of its own, checked one by one
ROUTING = ("partition_key", "ordered")  # a JobSpec's values that choose its queue, not stored
UNSHOWN = ("group_name",)  # columns an option sets that no record shows (read by claims)
RELATIVE = tuple(o for o in OPTIONS if o.relative)
option_values = operator.attrgetter(*(o.name for o in OPTIONS))  # a spec's, in that order

_settings: dict[tuple[Any, ...], dict[str, Any]] = {}  # validated spec options, see below


def spec_settings(spec: JobSpec) -> dict[str, Any]:
    """The validated options of one spec, by name (everything but OWN). Jobs enqueued
    together mostly share them, so each combination is checked once; the cache key holds
    the types too, because ``True == 1`` and ``1 == 1.0``."""
    values = option_values(spec)
    kinds = tuple(map(type, values))
    cacheable = True
    try:
        found = _settings.get((values, kinds))
    except TypeError:  # an unhashable value, certainly invalid: let the checks say why
        found, cacheable = None, False
    if found is None:
        found = {o.name: o.check(o.name, v, spec) for o, v in zip(OPTIONS, values, strict=True)}
        if cacheable:
            if len(_settings) >= 1024:
                _settings.clear()
            _settings[values, kinds] = found
    return found


# -- the columns ---------------------------------------------------------------------------
PLAIN = "plain"  # a number or text, read as it is
JSON = "json"  # a payload, stored as JSON text
STATUS = "status"  # a Status, stored as its value
TIME = "time"  # a datetime in UTC (SQLite: seconds since the epoch)
FLAG = "flag"  # a bool (SQLite: 0 or 1)
NAMES = "names"  # a tuple of names (PostgreSQL: text[]; SQLite: a JSON list)


@dataclasses.dataclass(frozen=True, slots=True)
class JobColumn:
    name: str
    kind: str
    nullable: bool


def _column(name: str, hint: Any) -> JobColumn:
    """The column behind the JobRecord field ``name`` of type ``hint``."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    parts = typing.get_args(hint) if union else (hint,)
    nullable = type(None) in parts
    rest = [part for part in parts if part is not type(None)]
    base = rest[0] if len(rest) == 1 else hint
    origin = typing.get_origin(base)
    if base is datetime:
        return JobColumn(name, TIME, nullable)
    if base is bool:
        return JobColumn(name, FLAG, nullable)
    if base is Status:
        return JobColumn(name, STATUS, nullable)
    if base in (int, float, str):
        return JobColumn(name, PLAIN, nullable)
    if origin is tuple:
        return JobColumn(name, NAMES, nullable)
    if base is Any or origin in (list, dict):
        return JobColumn(name, JSON, nullable or base is Any)
    raise TypeError(f"JobRecord.{name}: no column kind for its type {hint!r}")


_hints = typing.get_type_hints(JobRecord)
COLUMNS: tuple[JobColumn, ...] = tuple(
    _column(f.name, _hints[f.name]) for f in dataclasses.fields(JobRecord)
)
NAMES_OF_COLUMNS = tuple(c.name for c in COLUMNS)
_AT = {name: i for i, name in enumerate(NAMES_OF_COLUMNS)}


def _at(kind: str) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(COLUMNS) if c.kind == kind)


# the times, a time every row has first (whether the driver read it as a datetime says how
# it read them all), the flags and the lists of names
_TIME_AT = tuple(sorted(_at(TIME), key=lambda i: COLUMNS[i].nullable))
_FLAG_AT, _NAMES_AT = _at(FLAG), _at(NAMES)
_STATUS_OF = {status.value: status for status in Status}  # Status(text) is slow per claim


# How a record's value is read from a row ``r``'s value at {}: what read_jobs compiles.
_READ = {PLAIN: "r[{}]", TIME: "r[{}]", FLAG: "r[{}]", JSON: "decode(r[{}])",
         STATUS: "status_of[r[{}]]", NAMES: "tuple(r[{}])"}  # fmt: skip


def read_jobs(
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    time: Callable[[Any], datetime],
    list_out: Callable[[Any], list[str]],
) -> list[JobRecord]:
    """Records of job rows given as tuples in the order of ``names``. ``time`` and
    ``list_out``: the driver's conversions (see _typed)."""
    if not rows:
        return []
    read, at = _reader(tuple(names))
    return read(_typed(rows, at, time, list_out))


# a reader of rows (see _reader), and where those rows hold their times, flags and names
Reader = tuple[
    Callable[[Sequence[Sequence[Any]]], list[JobRecord]],
    tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
]


@functools.lru_cache(maxsize=64)
def _reader(names: tuple[str, ...]) -> Reader:
    """The reader of rows whose columns are ``names``, in that order: one expression per
    column of the record, compiled once per order of the columns, as dataclasses compiles
    an ``__init__``. On a claim of a hundred jobs reading them is most of the worker's own
    cost per job, and a loop over the columns for each row would cost several times more.
    Only positions (integers) go into the source, never a name the database gave."""
    at = {name: i for i, name in enumerate(names)}
    missing = [name for name in NAMES_OF_COLUMNS if name not in at]
    if missing:
        raise errors.StoreError(f"job rows lack the column(s) {', '.join(missing)}")
    values = ", ".join(_READ[c.kind].format(int(at[c.name])) for c in COLUMNS)
    scope: dict[str, Any] = {
        "build": build_job, "decode": payload.decode, "status_of": _STATUS_OF,
    }  # fmt: skip
    exec(f"def read(rows):\n    return [build({values}) for r in rows]\n", scope)
    times, flags, lists = (
        tuple(at[NAMES_OF_COLUMNS[i]] for i in positions)
        for positions in (_TIME_AT, _FLAG_AT, _NAMES_AT)
    )
    return scope["read"], (times, flags, lists)


def _typed(
    rows: Sequence[Sequence[Any]],
    at: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
    time: Callable[[Any], datetime],
    list_out: Callable[[Any], list[str]],
) -> Sequence[Sequence[Any]]:
    """Job rows whose times, flags and lists of names (at the positions ``at``, the first
    time one a row always has) are Python's datetimes in UTC, bools and lists: as they are,
    where the driver read them so (PostgreSQL, its session in UTC, reads every row of a
    result alike), else converted (SQLite: numbers, 0 or 1, JSON). A time shared by many
    rows (a claim's started_at, a bulk enqueue's created_at and run_at) is converted once.
    The other kinds are read as Python's types by both."""
    times, flags, names = at
    first = rows[0]
    when = first[times[0]]
    if (
        type(when) is datetime
        and when.tzinfo is UTC
        and all(type(first[flag]) is bool for flag in flags)
        and all(type(first[i]) is list for i in names)
    ):
        return rows
    converted: dict[Any, datetime | None] = {None: None}
    typed = []
    for row in rows:
        values = list(row)
        for i in times:
            value = values[i]
            found = converted.get(value, converted)
            if found is converted:
                found = converted[value] = time(value)
            values[i] = found
        for flag in flags:
            values[flag] = bool(values[flag])
        for i in names:
            values[i] = list_out(values[i])
        typed.append(values)
    return typed


# -- fresh jobs ----------------------------------------------------------------------------
# What a job just inserted holds besides its options and its own values (the schema's
# defaults); every other column it has is NULL.
FRESH: Mapping[str, Any] = {"status": Status.PENDING, "attempt": 0, "failed_sessions": (),
                            "losses": 0}  # fmt: skip
# The columns an insert assigns to each job: what it returns of them is what it stored.
ASSIGNED_TIMES = ("created_at", *(o.column for o in RELATIVE))
ASSIGNED = ("id", *ASSIGNED_TIMES)
_OPTION_AT = tuple(
    (o.name, _AT[o.column]) for o in OPTIONS if not o.relative and o.column not in UNSHOWN
)


class FreshJobs:
    """Records of jobs just inserted, from what was inserted (their options, checked, and
    their own values) and what the insert assigned (ASSIGNED, at ``at`` in its rows). The
    record values an options dict gives are made once per dict (jobs enqueued together
    mostly share one), and each time the insert assigned is converted once (``time``: the
    driver's conversion)."""

    def __init__(self, at: Mapping[str, int], time: Callable[[Any], datetime]) -> None:
        self._id = at["id"]
        self._places = tuple((_AT[name], at[name]) for name in ASSIGNED_TIMES)
        self._time = time
        self._times: dict[Any, datetime | None] = {None: None}
        self._bases: dict[int, tuple[Mapping[str, Any], list[Any]]] = {}

    def job(
        self, options: Mapping[str, Any], own: tuple[Any, Any, Any], inserted: Sequence[Any]
    ) -> JobRecord:
        """``own``: its args and kwargs (decoded) and key; ``inserted``: its row."""
        found = self._bases.get(id(options))
        if found is None or found[0] is not options:
            found = self._bases[id(options)] = (options, _base(options))
        values = found[1].copy()
        values[_ID] = int(inserted[self._id])
        values[_ARGS], values[_KWARGS], values[_KEY] = own
        times = self._times
        for i, j in self._places:
            moment = inserted[j]
            value = times.get(moment, times)
            if value is times:
                value = times[moment] = self._time(moment)
            values[i] = value
        return build_job(*values)


def _base(options: Mapping[str, Any]) -> list[Any]:
    values: list[Any] = [None] * len(COLUMNS)
    for name, value in FRESH.items():
        values[_AT[name]] = value
    for name, i in _OPTION_AT:
        values[i] = options[name]
    return values


_ID = _AT["id"]
_ARGS, _KWARGS, _KEY = (_AT[name] for name in OWN)


def _check_declaration() -> None:
    """Fail at import where the declaration and the records disagree."""
    spec_fields = {f.name for f in dataclasses.fields(JobSpec)}
    declared = {o.name for o in OPTIONS} | set(OWN) | set(ROUTING)
    if spec_fields != declared:
        raise TypeError(f"JobSpec's fields and OPTIONS differ: {sorted(spec_fields ^ declared)}")
    given = {*FRESH, *OWN, *ASSIGNED, *(o.column for o in OPTIONS if o.column not in UNSHOWN)}
    unset = [c.name for c in COLUMNS if not c.nullable and c.name not in given]
    if unset or not given <= _AT.keys():
        raise TypeError(f"a fresh job has no value for {unset} or no such columns: {given}")


_check_declaration()
