"""What a worker makes of the partitions its heartbeats hear (plunder.ownership): the
newest generation of each queue's assignment wins, and the queues its claims name."""

from __future__ import annotations

from plunder.model import Partitioning
from plunder.ownership import Ownership


def test_the_newest_generation_heard_wins() -> None:
    own = Ownership()
    own.heard([Partitioning("q", 4, 5, (0, 1))])
    own.heard([Partitioning("q", 4, 4, (0, 1, 2, 3))])  # an older answer, late: ignored
    assert own.preferred(["q"]) == ["q~0", "q~1"]
    own.heard([Partitioning("q", 4, 6, (3,))])
    assert own.preferred(["q"]) == ["q~3"]
    assert own.generations() == {"q": 6}
    own.heard([])  # no longer partitioned (or left): forgotten
    assert own.preferred(["q"]) is None and own.everything(["q"]) == ["q"]


def test_own_partitions_first_then_every_partition() -> None:
    own = Ownership()
    assert own.preferred(["a", "q"]) is None  # nothing partitioned: no preference
    own.declared({"q": 2})
    assert own.preferred(["a", "q"]) == ["a"]  # declared, none owned yet
    assert own.everything(["a", "q"]) == ["a", "q", "q~0", "q~1"]
    own.heard([Partitioning("q", 2, 1, (1,))])
    assert own.preferred(["a", "q"]) == ["a", "q~1"]
    own.declared({"q": 8})  # what a heartbeat said stays
    assert own.everything(["q"]) == ["q", "q~0", "q~1"]
