"""``plunder job N --follow``: a job's stream as a person or a program reads it.

Text: the chunks on stdout as they are (a chunk that is not a string as JSON), a new
attempt as a one-line note on stderr, progress as a status at the end of the current line
on stderr (a terminal only) that is erased before the next chunk. JSON: one object per
event on stdout, ``{"kind", "attempt", "data"}``, and nothing else.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from plunder.model import StreamEvent

ERASE_TO_END = "\x1b[K"


def json_line(event: StreamEvent) -> str:
    data = {"kind": event.kind, "attempt": event.attempt, "data": event.data}
    return json.dumps(data, ensure_ascii=False)


def progress_text(data: Any) -> str:
    """``[3/10]`` for ``{"current": 3, "total": 10}``, ``[3]`` without a total."""
    if not isinstance(data, dict):
        return f"[{data}]"
    current, total = data.get("current"), data.get("total")
    shown = [_number(current)] if total is None else [_number(current), _number(total)]
    return "[" + "/".join(shown) + "]"


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


class Follower:
    """Writes one job's events to ``out`` and ``err``; ``progress``: show the status."""

    def __init__(self, out: TextIO, err: TextIO, *, progress: bool, as_json: bool) -> None:
        self.out = out
        self.err = err
        self.progress = progress
        self.as_json = as_json
        self._mid_line = False  # the last chunk did not end its line
        self._status = ""  # the progress status now shown on the terminal

    def event(self, event: StreamEvent) -> None:
        if self.as_json:
            self.out.write(json_line(event) + "\n")
            self.out.flush()
        elif event.kind == "chunk":
            self._erase_status()
            text = event.data if isinstance(event.data, str) else json.dumps(event.data)
            self.out.write(text)
            self.out.flush()
            self._mid_line = self._mid_line if not text else not text.endswith("\n")
        elif event.kind == "attempt":
            previous = event.data.get("previous") if isinstance(event.data, dict) else None
            self.note(f"attempt {event.attempt} starts over (attempt {previous} did not succeed)")
        elif event.kind == "progress" and self.progress:
            self._show_status(" " + progress_text(event.data))

    def note(self, line: str) -> None:
        """A line on stderr, after the text so far (ended first) and without the status."""
        self._erase_status()
        if self._mid_line:
            self.out.write("\n")
            self.out.flush()
            self._mid_line = False
        self.err.write(line + "\n")
        self.err.flush()

    def _show_status(self, status: str) -> None:
        # at the end of the line the text is on, not over it: a carriage return would
        # put the status over (and erasing it erase) the start of an unfinished line
        self._erase_status()
        self.err.write(status)
        self.err.flush()
        self._status = status

    def _erase_status(self) -> None:
        if self._status:
            self.err.write("\b" * len(self._status) + ERASE_TO_END)
            self.err.flush()
            self._status = ""
