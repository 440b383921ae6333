"""``python -m tests.chaos.mutant <plunder arguments>``: plunder with its fencing broken on
purpose, for the harness's self-check. The completion no longer checks that the claim is
current (attempt, session, running, live session): a zombie's late acknowledgement lands.
The worker's own cut of its calls in flight, when its session's lease runs out by its
clock, is off too: on waking it could otherwise refuse the late commits before the
database is asked, and the self-check would see nothing land.

Nothing in plunder itself knows about this; the query text is patched in this process only.
"""

from __future__ import annotations

import re

from plunder.store import queries
from plunder.store.postgres import PostgresStore

# the WHERE clause of the statement that completes the job (PostgreSQL: up to its
# RETURNING; SQLite: to the end of the statement), in job_complete and in
# job_complete_notify, which includes it
FENCE = {
    "postgres": (
        r"^(\s*)WHERE j\.id = u\.job_id\b.*?(?=^\s*RETURNING)",
        r"\1WHERE j.id = u.job_id\n",
    ),
    "sqlite": (r"^WHERE\b.*?(?=;|\Z)", "WHERE plunder_jobs.id = b.column1"),
}


def break_fencing() -> None:
    for dialect, (fence, unfenced) in FENCE.items():
        named = queries.load(dialect)  # cached: every later user sees the patched text
        # the second includes the first, where the dialect has it (PostgreSQL's NOTIFY)
        for name in [n for n in ("job_complete", "job_complete_notify") if n in named]:
            patched = re.sub(fence, unfenced, named[name], count=1, flags=re.S | re.M)
            assert patched != named[name], f"no fence found in {dialect} {name}"
            named[name] = patched
    PostgresStore.calls_cut = lambda self, reason, final=False: 0  # type: ignore[method-assign]


if __name__ == "__main__":
    break_fencing()
    from plunder.cli import main

    main()
