"""First store measurement: enqueue N jobs in one batch, then claim + complete them in
batches, on SQLite (a file, synchronous=FULL) and PostgreSQL (a throwaway cluster with
fsync on), through the store seam with fencing and run history on. One process, no worker
overhead: this is the store's own cost. The full side-by-side benchmark is ``plunder bench``.

    python -m bench.store_throughput [--jobs 20000] [--batch 100] [--repeat 3]   # from the root
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psycopg
from tests.support import pgcluster

from plunder.model import Completion, JobSpec
from plunder.store import Store, open_store


def measure(store: Store, jobs: int, batch: int) -> tuple[float, float]:
    store.migrate()
    specs = [JobSpec("bench.noop", [i]) for i in range(jobs)]
    started = time.perf_counter()
    store.job_enqueue_many(specs)
    enqueue_rate = jobs / (time.perf_counter() - started)
    session = store.session_open(name="bench", host="bench", pid=0, queues=["default"], expiry=600)
    done = 0
    started = time.perf_counter()
    while True:
        claimed = store.job_claim_many(
            session.id, queues=["default"], tasks=["bench.noop"], limit=batch
        )
        if not claimed:
            break
        ack = store.job_complete_many([Completion(j.claim, None) for j in claimed])
        done += len(ack.accepted)
    drain_rate = done / (time.perf_counter() - started)
    assert done == jobs, f"completed {done} of {jobs}"
    store.session_close(session.id)
    return enqueue_rate, drain_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"sqlite": [], "postgres": []}
    cluster = pgcluster.create()  # production-like: fsync and synchronous_commit on
    try:
        for run in range(options.repeat):
            folder = Path(tempfile.mkdtemp(prefix="plunder-bench-"))
            store = open_store(f"sqlite:///{folder / 'bench.db'}")
            results["sqlite"].append(measure(store, options.jobs, options.batch))
            store.close()
            name = f"bench_{run}"
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            store = open_store(cluster.url(name))
            results["postgres"].append(measure(store, options.jobs, options.batch))
            store.close()
    finally:
        cluster.destroy()
    print(
        f"| backend | enqueue {options.jobs} in one batch (jobs/s) | claim + complete, "
        f"batches of {options.batch} (jobs/s) |"
    )
    print("|---|---:|---:|")
    for backend, rows in results.items():
        enqueue = statistics.median(r[0] for r in rows)
        drain = statistics.median(r[1] for r in rows)
        print(f"| {backend} | {enqueue:,.0f} | {drain:,.0f} |")


if __name__ == "__main__":
    main()
