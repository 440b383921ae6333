"""The ``plunder`` command: parses, wires, prints, exits. Only ``python -m plunder`` and the
console script import it (``main``).

A user mistake (a bad URL, an unknown job, malformed JSON, an unreachable database) prints
one line on stderr and exits non-zero; a traceback means a bug in plunder.

``root`` is the group and its options; the commands live by what they are about (``run``:
worker and janitor; ``jobs``: one job or many; ``database``: init and status; ``showcase``:
demo and bench; ``workers``: a running worker's queues; ``partitions``: partitioned
queues; ``schedules``: periodic jobs; ``queues``: paused queues; ``dashboard``: the
dashboard without a gateway), and print through ``output``.
"""

from __future__ import annotations

from plunder.cli import (
    dashboard,
    database,
    gateway,
    jobs,
    limits,
    partitions,
    queues,
    run,
    schedules,
    showcase,
    workers,
    workflow,
)
from plunder.cli.root import main

__all__ = ["main"]

for command in (
    database.init,
    run.worker,
    run.janitor,
    jobs.enqueue,
    database.status,
    workers.worker_queues,
    partitions.partitions,
    partitions.ordered,
    jobs.jobs,
    jobs.job,
    jobs.cancel,
    jobs.retry,
    workflow.workflow,
    gateway.serve,
    gateway.keys,
    limits.limits,
    schedules.schedules,
    queues.queues,
    dashboard.dashboard,
    showcase.demo,
    showcase.bench,
):
    main.add_command(command)
