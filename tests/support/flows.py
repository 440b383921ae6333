"""A workflow every runner of workflows is tested with: a diamond whose last job sees its
parents' results, each with its own parent's."""

from __future__ import annotations

from collections.abc import Callable

import plunder


def run_diamond(app: plunder.App, explain: Callable[[], str]) -> list[int]:
    """A diamond (a → b, c → d) of the "gather" task enqueued by ``app`` and run by a worker
    already serving it: d sees b's and c's results, each with its own parent's; the ids of
    a, b, c, d. ``explain()`` (the worker's log) is the message of a wrong result."""
    flow = plunder.Flow(app)
    a = flow.add("gather", "a")
    b, c = flow.group(plunder.call("gather", "b"), plunder.call("gather", "c"), after=a)
    d = flow.add("gather", "d", after=[b, c])
    workflow = flow.enqueue()
    ids = [workflow.job(n).id for n in (a, b, c, d)]
    result = workflow.job(d).result(timeout=60)
    assert result == [
        "d",
        [[ids[1], ["b", [[ids[0], ["a", []]]]]], [ids[2], ["c", [[ids[0], ["a", []]]]]]],
    ], explain()
    return ids
