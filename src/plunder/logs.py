"""Log lines as text (the default) or as one JSON object a line (``--log-format json``),
and the fields that name a task's job in each of its lines.

A task's lines (``ctx.logger``) carry ``job_id``, ``attempt``, ``task``, ``queue`` and
``session``: as keys of the JSON object, or after the message in text.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from plunder.model import JobRecord

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOB_FIELDS = ("job_id", "attempt", "task", "queue", "session")
FORMATS = ("text", "json")
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"  # a task's lines in its run's history
MAX_LOG_LINES = 200


class LineCapture(logging.Handler):
    """A task's log lines kept in ``lines`` (see keep_line), for its run's history."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        keep_line(self.lines, self.format(record))


def keep_line(lines: list[str], line: str) -> None:
    lines.append(line)
    if len(lines) > MAX_LOG_LINES * 2:  # keep memory bounded; the store keeps the tail
        del lines[: len(lines) - MAX_LOG_LINES]


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the job's
    fields where the line is a task's, and the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class JobFields(logging.Filter):
    """Puts a job's fields on each record of a task's logger (a filter of the logger
    itself, so the records carry them to every handler they propagate to)."""

    def __init__(self, job: JobRecord) -> None:
        super().__init__()
        self.fields = {
            "job_id": job.id,
            "attempt": job.attempt,
            "task": job.task,
            "queue": job.queue,
            "session": job.session_id,
        }

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.update(self.fields)
        return True


class TextFormatter(logging.Formatter):
    """The default format, and a task's job fields in brackets after the message."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if getattr(record, "job_id", None) is None:
            return text
        fields = " ".join(f"{name}={getattr(record, name, None)}" for name in JOB_FIELDS)
        return f"{text} [{fields}]"


_handlers: list[logging.Handler] = []  # the one configure() installed


def configure(level: str, log_format: str = "text") -> None:
    """The process's logging on stderr, as ``log_format`` ("text" or "json"), at ``level``;
    as ``logging.basicConfig``, nothing changes where the program set up logging itself."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    root = logging.getLogger()
    if _handlers and _handlers[0] in root.handlers:
        root.removeHandler(_handlers.pop())
    elif root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    _handlers[:] = [handler]
    root.addHandler(handler)
    root.setLevel(level.upper())
