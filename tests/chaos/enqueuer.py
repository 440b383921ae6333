"""``python -m tests.chaos.enqueuer URL FOLDER NAME COUNT RATE [PAD]``: a producer process
for the chaos suite. It enqueues COUNT witness jobs at RATE per second (each with PAD
characters of ballast, default none), one transaction each,
and appends its history (``invoke`` before the call, then ``ok``/``fail``/``info``) to
``FOLDER/history-NAME.jsonl``; a killed producer leaves an ``invoke`` with no answer,
which the harness reads as ``info`` (the outcome is unknown)."""

from __future__ import annotations

import json
import os
import sys
import time

from plunder import errors
from plunder.store import open_store
from tests.chaos.harness import witness


def main(url: str, folder: str, name: str, count: int, rate: float, pad: int = 0) -> None:
    store = open_store(url)
    fd = os.open(
        os.path.join(folder, f"history-{name}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT
    )

    def record(uid: str, kind: str, error: str | None = None) -> None:
        line = {"uid": uid, "type": kind, "t": time.monotonic(), "error": error}
        os.write(fd, (json.dumps(line) + "\n").encode())

    start = time.monotonic()
    for i in range(count):
        time.sleep(max(0.0, start + i / rate - time.monotonic()))
        extra = {"pad": "x" * pad} if pad else {}
        spec = witness(f"{name}-{i}", queue=f"q{1 + i % 2}", sleep_ms=i % 30, **extra)
        record(spec.kwargs["uid"], "invoke")
        try:
            store.job_enqueue_many([spec])
        except (errors.PayloadError, errors.InvalidName, errors.StoreFull) as exc:
            record(spec.kwargs["uid"], "fail", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # unknown outcome
            record(spec.kwargs["uid"], "info", f"{type(exc).__name__}: {exc}")
        else:
            record(spec.kwargs["uid"], "ok")
    store.close()


if __name__ == "__main__":
    pad = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), pad)
