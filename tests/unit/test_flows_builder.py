"""plunder.Flow refuses a bad graph where it is built, before the store is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

import plunder
from plunder import graph
from plunder.graph import Edge


def test_a_flow_refuses_bad_parents_policies_and_emptiness(tmp_path: Path) -> None:
    app = plunder.App(f"sqlite:///{tmp_path / 'p.db'}")
    try:

        @app.task(name="t")
        def t(x: int = 0) -> int:
            return x

        flow, other = plunder.Flow(app), plunder.Flow(app)
        with pytest.raises(ValueError, match="an empty flow"):
            flow.enqueue()
        stranger = other.add(t)
        with pytest.raises(ValueError, match="belongs to another flow"):
            flow.add(t, after=stranger)
        with pytest.raises(TypeError, match="after= takes nodes of this flow"):
            flow.add(t, after="job 1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="on_failure must be one of skip, fail, run"):
            flow.add(t, after=flow.add(t), on_failure="ignore")
        with pytest.raises(TypeError, match=r"plunder\.flows\.call"):
            flow.chain(t)  # type: ignore[arg-type]
        first, second = flow.chain(plunder.call(t, 1), plunder.call(t, 2))
        assert flow.edges[-1] == Edge(first.index, second.index, "skip")
    finally:
        app.close()


def test_the_order_puts_parents_first_and_names_a_cycle() -> None:
    edges = [Edge(2, 0), Edge(0, 1), Edge(2, 1), Edge(7, 2, new=False)]
    order = graph.order(3, edges)
    assert order.index(2) < order.index(0) < order.index(1)
    with pytest.raises(ValueError, match=r"cycle through its jobs \[1, 2\]"):
        graph.order(3, [Edge(1, 2), Edge(2, 1)])
    with pytest.raises(ValueError, match="a parent job id must be a positive integer"):
        graph.order(1, [Edge(0, 0, new=False)])
