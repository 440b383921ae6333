"""``python -m tests.chaos.mutant <plunder arguments>``: plunder with its fencing broken on
purpose, for the harness's self-check. The completion no longer checks that the claim is
current (attempt, session, running, live session): a zombie's late acknowledgement lands.

Nothing in plunder itself knows about this; the query text is patched in this process only.
"""

from __future__ import annotations

import re

from plunder.store import queries

UNFENCED = {
    "postgres": "WHERE j.id = u.job_id",
    "sqlite": "WHERE id = :job_id",
}


def break_fencing() -> None:
    for dialect, where in UNFENCED.items():
        named = queries.load(dialect)  # cached: every later user sees the patched text
        named["job_complete"] = re.sub(
            r"^WHERE\b.*", where, named["job_complete"], flags=re.S | re.M
        )


if __name__ == "__main__":
    break_fencing()
    from plunder.cli import main

    main()
