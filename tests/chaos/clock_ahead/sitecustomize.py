"""Test only (tests/chaos/test_schedules.py): put this folder first on a process's
PYTHONPATH and its clock runs PLUNDER_TEST_CLOCK_AHEAD seconds (default 30) ahead:
time.time, time.time_ns and datetime.now/utcnow/today. Monotonic clocks are left alone."""

from __future__ import annotations

import datetime as _datetime
import os
import sys
import time as _time
from typing import Any

AHEAD = float(os.environ.get("PLUNDER_TEST_CLOCK_AHEAD", "30"))
_base = _datetime.datetime
_time_real = _time.time
_time_ns_real = _time.time_ns


def _ahead() -> float:
    return _time_real() + AHEAD


def _ahead_ns() -> int:
    return _time_ns_real() + int(AHEAD * 1e9)


class _AnyDatetime(type):
    """isinstance(x, datetime) stays true of the datetimes made before, and by C code."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _base)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _base)


class _Ahead(_base, metaclass=_AnyDatetime):
    __slots__ = ()  # instances the size of a datetime, as C extensions expect

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return _base.fromtimestamp(_ahead(), tz)

    @classmethod
    def utcnow(cls) -> Any:
        return _base.fromtimestamp(_ahead(), _datetime.UTC).replace(tzinfo=None)

    @classmethod
    def today(cls) -> Any:
        return _base.fromtimestamp(_ahead())


_time.time = _ahead
_time.time_ns = _ahead_ns
_datetime.datetime = _Ahead  # type: ignore[misc]
sys.stderr.write(f"clock ahead by {AHEAD:g}s\n")
