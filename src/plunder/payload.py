"""The JSON codec for job arguments, results and stream data, and the validation of names.

plunder never pickles. Payloads are JSON text, identical on every backend, so what a job
stores is exactly what it reads back (key order and non-ASCII text included). A payload that
cannot round-trip — NaN or Infinity, a lone surrogate, a non-JSON type, text over the size
limit — is refused with :class:`~plunder.errors.PayloadError` before anything is written.
NUL characters are legal JSON and are kept (they are stored escaped as ``\\u0000``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from plunder import errors

MAX_PAYLOAD_BYTES = 1024 * 1024  # per argument list, result or stream chunk
MAX_NESTING = 200

_QUEUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
_TASK = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]{0,199}")
MAX_KEY_CHARS = 256

_known_queues: set[str] = set()  # names already checked: the check runs on every job
_known_tasks: set[str] = set()
_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """``_encoder``'s C encoder, made once. ``JSONEncoder.encode`` builds a new one at every
    call, which costs two thirds of encoding a short argument list (1 µs of 3). Made without
    circular-reference markers: a shared markers dict is not safe across threads, and an
    object that contains itself ends in RecursionError instead (see ``_dump``). None where
    the interpreter has no C encoder or it does not encode a probe exactly as ``_encoder``."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    probe = [1, -2.5, 10**30, 'é\u0000"\\', None, True, {"a": [{}], "b": ""}, ()]
    try:
        made = make(
            None, _encoder.default, json.encoder.encode_basestring, None, ":", ",",
            False, False, False,
        )  # fmt: skip
        same = "".join(made(probe, 0)) == _encoder.encode(probe)
    except Exception:  # a different signature in another Python: use the standard path
        return None
    try:
        made([float("nan")], 0)
    except ValueError:  # refused, as allow_nan=False must
        return made if same else None
    return None


_c_encode = _c_encoder()


def _dump(value: Any) -> str:
    """``_encoder.encode(value)``, through the C encoder made once where there is one."""
    if _c_encode is None:
        return _encoder.encode(value)
    try:
        return "".join(_c_encode(value, 0))
    except RecursionError:
        # too deep, or it contains itself: the standard encoder says which
        return _encoder.encode(value)


_INT_FAST = 10**18  # far below any limit: written as the encoder would, without it


def encode(
    value: Any, *, what: str = "payload", of: str | None = None, limit: int = MAX_PAYLOAD_BYTES
) -> str:
    """Encode ``value`` as compact JSON text, or raise PayloadError naming ``what`` (``of``
    a task, say, when given: the name is only written out for an error)."""
    if value is None:
        return "null"
    kind = type(value)
    if kind is int and -_INT_FAST < value < _INT_FAST:  # a task's usual result: a count, an id
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    if kind in (list, dict) and not value:  # the common empty cases, without the encoder
        return "[]" if kind is list else "{}"
    try:
        text = _dump(value)
    except (TypeError, ValueError) as exc:
        raise errors.PayloadError(f"{_name(what, of)} is not JSON-serializable: {exc}") from exc
    except RecursionError as exc:
        raise errors.PayloadError(f"{_name(what, of)} is nested too deeply") from exc
    # most payloads are ASCII: one byte per character, and no lone surrogates
    size = len(text) if text.isascii() else _utf8_size(text, what, of)
    if size > limit:
        raise errors.PayloadError(
            f"{_name(what, of)} is {size} bytes of JSON; the limit is {limit}"
        )
    # Python's JSON decoder recurses too: a payload nested nearly to the recursion limit
    # encodes here but cannot be decoded from a worker's deeper call stack.
    # (a text no longer than MAX_NESTING cannot hold more brackets)
    if (
        len(text) > MAX_NESTING
        and text.count("[") + text.count("{") > MAX_NESTING
        and _too_deep(value)
    ):
        raise errors.PayloadError(
            f"{_name(what, of)} is nested more than {MAX_NESTING} levels deep"
        )
    return text


def _name(what: str, of: str | None) -> str:
    return what if of is None else f"{what} of {of}"


def _utf8_size(text: str, what: str, of: str | None) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise errors.PayloadError(
            f"{_name(what, of)} contains text that is not valid Unicode: {exc}"
        ) from exc


def _too_deep(value: Any) -> bool:
    """Whether lists and dicts nest more than MAX_NESTING deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[Any] = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth >= MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


_decoder = json.JSONDecoder()
# the scanner decode() calls, without the whitespace regexes around it
_scan = _decoder.scan_once  # type: ignore[attr-defined]


def decode(text: str | None) -> Any:
    """Decode stored JSON text (None stays None)."""
    if text is None:
        return None
    if text == "[]":  # the common empty cases, without the parser (hot on every claim)
        return []
    if text == "{}":
        return {}
    try:  # plunder writes compact JSON: one value from the first character to the last
        value, end = _scan(text, 0)
    except StopIteration:  # not a value at the start: the full decoder says why
        return _decoder.decode(text)
    if end == len(text):
        return value
    return _decoder.decode(text)  # surrounding whitespace, or extra data


_SCALARS = frozenset({str, int, float, bool, type(None)})


def copy_or_decode(value: Any, text: str) -> Any:
    """What ``text``, the encoding of ``value``, decodes to: a list or dict of plain
    scalars is copied instead of parsed (the common arguments decode to equal values, and
    copying costs a fraction of parsing); anything else is decoded."""
    kind = type(value)
    if kind is list or kind is tuple:
        if _SCALARS.issuperset(map(type, value)):
            return list(value)
    elif kind is dict and _SCALARS.issuperset(map(type, value.values())):
        return dict(value)
    return decode(text)


def parse(text: str, *, what: str = "JSON") -> Any:
    """Parse JSON written by a person (the command line, an HTTP body), strictly."""

    def reject_constant(name: str) -> Any:
        raise errors.PayloadError(f"{what}: {name} is not allowed")

    def reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        value: dict[str, Any] = {}
        for key, item in pairs:
            if key in value:  # json.loads would keep the last one, silently
                raise errors.PayloadError(f"{what}: the key {key!r} appears more than once")
            value[key] = item
        return value

    try:
        return json.loads(text, parse_constant=reject_constant, object_pairs_hook=reject_duplicates)
    except errors.PayloadError:
        raise
    except RecursionError as exc:
        raise errors.PayloadError(f"{what} is nested too deeply") from exc
    except ValueError as exc:
        raise errors.PayloadError(f"{what} is not valid JSON: {exc}") from exc


def _check_name(
    name: object, pattern: re.Pattern[str], known: set[str], rule: str, kind: str
) -> str:
    if isinstance(name, str) and name in known:
        return name
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise errors.InvalidName(f"invalid {kind} name {name!r}: use {rule}")
    if len(known) < 10_000:
        known.add(name)
    return name


def check_queue(name: object) -> str:
    return _check_name(
        name,
        _QUEUE,
        _known_queues,
        "1-128 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit",
        "queue",
    )


PARTITION_MARK = "~"  # "q~3": partition 3 of queue q, a name no user queue can have
MAX_PARTITIONS = 1024
_PARTITION = re.compile(r"(.+)~(0|[1-9][0-9]{0,3})")


def partition_queue(queue: str, partition: int) -> str:
    """The queue that holds the jobs of ``partition`` of ``queue``."""
    return f"{queue}{PARTITION_MARK}{partition}"


def base_queue(name: str) -> str:
    """The queue a stored queue name is of: ``q`` for ``q~3``, and ``q`` for ``q``."""
    return name.partition(PARTITION_MARK)[0]


def check_stored_queue(name: object) -> str:
    """A queue as a job may be stored in it: a user's queue, or a partition of one."""
    if isinstance(name, str) and PARTITION_MARK in name:
        found = _PARTITION.fullmatch(name)
        if found is None or int(found[2]) >= MAX_PARTITIONS:
            raise errors.InvalidName(f"invalid partition queue {name!r}: use QUEUE~N, N < 1024")
        check_queue(found[1])
        return name
    return check_queue(name)


def check_task(name: object) -> str:
    return _check_name(
        name,
        _TASK,
        _known_tasks,
        "1-200 characters from A-Z a-z 0-9 _ . : -, starting with a letter or underscore",
        "task",
    )


def check_key(key: object) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS or not key.isprintable():
        raise errors.InvalidName(
            f"invalid idempotency key {key!r}: use 1-{MAX_KEY_CHARS} printable characters"
        )
    return key
