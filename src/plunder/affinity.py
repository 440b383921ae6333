"""Labels, affinity and slot cost (docs/guide/affinity.md): their checks and stored forms.

A worker's labels are ``key=value`` pairs (``model=llama3-70b``). A job may *prefer*
labels (``affinity``: run on a worker holding all of them while one with a free slot
lives, else at once anywhere) or *require* them (``require``: only on a holder, waiting
for one). Both are stored as one text in PostgreSQL's array literal form,
``{gpu=a100,model=llama3-70b}`` (sorted; NULL: none), which PostgreSQL casts to text[] and
SQLite takes apart; the characters a label may have make that literal need no quoting.

A job's ``cost`` is the slots of its worker it takes while it runs (docs/guide/routing.md,
decision 0019): a claim takes jobs in claim order while their costs fit the slots it
offers, stops at the first that does not, and skips those costing more than the worker
has in all (its session's ``slots``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MAX_LABELS = 32  # labels of one worker or one job
MAX_COST = 1000  # slots one job may take
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_VALUE = re.compile(r"[A-Za-z0-9_.:/@+-]{1,200}")


def label(key: Any, value: Any) -> str:
    """``key=value``, checked: a key of letters, digits, ``_ . -``; a value of those and
    ``: / @ +``."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"a label's key must be 1 to 100 letters, digits or '_.-', not {key!r}")
    if not isinstance(value, str) or not _VALUE.fullmatch(value):
        raise ValueError(
            f"label {key!r}: its value must be 1 to 200 letters, digits or '_.:/@+-', not {value!r}"
        )
    return f"{key}={value}"


def parse(text: str) -> tuple[str, str]:
    """``key=value`` (the command line's ``--label``) as (key, value), checked."""
    key, sep, value = str(text).partition("=")
    if not sep:
        raise ValueError(f"a label is key=value, not {text!r}")
    label(key, value)
    return key, value


def labels(given: Mapping[str, str] | Iterable[str] | None) -> tuple[str, ...]:
    """A mapping (or ``key=value`` texts) as sorted ``key=value`` labels, one per key."""
    if given is None:
        return ()
    pairs = dict(given.items() if isinstance(given, Mapping) else map(parse, given))
    if len(pairs) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, not {len(pairs)}")
    return tuple(sorted(label(k, v) for k, v in pairs.items()))


def stored(name: str, given: Any) -> str | None:
    """A job's ``affinity`` or ``require`` as its column holds it (None: none)."""
    if given is None:
        return None
    if not isinstance(given, Mapping):
        raise ValueError(f"{name} must be a dict of labels, like {{'model': 'llama3-70b'}}")
    found = labels(given)
    return "{" + ",".join(found) + "}" if found else None


def of_stored(text: str | None) -> dict[str, str]:
    """A stored ``affinity`` or ``require`` as a dict."""
    if not text:
        return {}
    return dict(part.split("=", 1) for part in text.strip("{}").split(","))


def cost(value: Any) -> int:
    """A job's slots, checked: 1 to MAX_COST."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COST:
        raise ValueError(f"cost must be an integer from 1 to {MAX_COST}, not {value!r}")
    return value


def capacity(slots: Any) -> int:
    """A session's slots in all as its row holds them: None (not said) is MAX_COST, which
    every job fits; more than that counts as MAX_COST too."""
    if slots is None:
        return MAX_COST
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"a worker's slots must be a positive integer, not {slots!r}")
    return min(slots, MAX_COST)


def taken(jobs: Iterable[Any]) -> int:
    """The slots these jobs take: the sum of their costs."""
    return sum(job.cost for job in jobs)
