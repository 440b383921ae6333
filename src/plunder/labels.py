"""A worker's labels (docs/guide/affinity.md): given at its start, changed by its tasks.

```
 Worker(labels=...) ─▶ Labels ◀── ctx.add_label("model", "llama3-70b") (a task, any thread)
                         │
                         └──▶ Hello (the session opens with them), then every Beat
```

A change reaches the session with the worker's next heartbeat (within one heartbeat
interval): claims see the new holder from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from plunder import affinity, errors


class Labels:
    """The labels a worker holds now, as ``key=value`` texts; safe from any thread."""

    def __init__(self, given: Mapping[str, str] | Iterable[str] | None = None) -> None:
        self._held = dict(map(affinity.parse, affinity.labels(given)))
        self._lock = threading.Lock()

    def held(self) -> tuple[str, ...]:
        with self._lock:
            return affinity.labels(self._held)

    def add(self, key: str, value: str) -> None:
        affinity.label(key, value)
        with self._lock:
            if len(self._held) >= affinity.MAX_LABELS and key not in self._held:
                raise ValueError(f"a worker holds at most {affinity.MAX_LABELS} labels")
            self._held[key] = value

    def remove(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)


class Labelling:
    """The label methods of a task's context (plunder.Context)."""

    labels: Labels | None = None  # the worker's, set when the job starts

    def add_label(self, key: str, value: str) -> None:
        """This worker now holds label ``key=value`` (one value per key): jobs preferring
        or requiring it come here from the next heartbeat on."""
        self._worker_labels().add(key, value)

    def remove_label(self, key: str) -> None:
        """This worker no longer holds label ``key`` (whatever its value)."""
        self._worker_labels().remove(key)

    def _worker_labels(self) -> Labels:
        if self.labels is None:
            raise errors.ConfigError("this task runs outside a worker: it has no labels")
        return self.labels
