"""How the commands print: records as tables or JSON, text as it is, a user's mistake as one
line on stderr with exit status 1."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

from plunder import errors

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: records as objects, times as ISO text, enums as values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def literal(value: object, style: str = "") -> Text:
    """Text that rich prints as it is: names, payloads and messages can hold ``[/x]`` or
    ``:smile:``, which rich would otherwise read as markup (and fail on) or as emoji."""
    return Text(str(value), style=style)


def error_line(message: object) -> Text:
    return Text.assemble(literal("error:", "red"), " ", literal(message))


def emit_json(value: Any) -> None:
    click.echo(json.dumps(plain(value), indent=2, ensure_ascii=False))


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn plunder's errors (and a wait that timed out) into one line and exit status 1."""
    try:
        yield
    except (errors.PlunderError, ValueError, TypeError, TimeoutError) as exc:
        err.print(error_line(" ".join(str(exc).split())), soft_wrap=True)
        sys.exit(1)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)
