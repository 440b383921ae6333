"""The fast record builders make ordinary frozen records, field for field what the
dataclass constructor makes."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime

import pytest

from plunder.model import JobRecord, JobSpec, build_job, positional_builder
from plunder.states import Status
from plunder.task import build_spec


def _values(cls: type) -> list[object]:
    # a distinct value per field, so that a field filled from the wrong position shows
    return [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)]


@pytest.mark.parametrize(("cls", "build"), [(JobRecord, build_job), (JobSpec, build_spec)])
def test_a_built_record_is_the_record_the_constructor_makes(cls: type, build: object) -> None:
    values = _values(cls)
    built = build(*values)  # type: ignore[operator]
    made = cls(*values)
    assert type(built) is cls
    assert built == made
    assert [getattr(built, f.name) for f in dataclasses.fields(cls)] == values
    assert repr(built) == repr(made)
    assert pickle.loads(pickle.dumps(built)) == made


def test_a_built_record_is_frozen() -> None:
    now = datetime.now(UTC)
    record = build_job(
        1, "q", "t", [], {}, 0, Status.PENDING, 0, 1, None, 1.0, 300.0, True, None,
        now, now, None, None, None, None, None, None, (), 0, True, None, None, None, None, 1,
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.status = Status.RUNNING  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del record.id  # type: ignore[misc]
    assert record.attempts_left == 1 and not record.suspect  # its properties work


def test_a_builder_takes_exactly_the_fields() -> None:
    with pytest.raises(TypeError):
        build_job(*_values(JobRecord)[:-1])
    with pytest.raises(TypeError):
        build_job(*_values(JobRecord), "one too many")


def test_only_slots_dataclasses_have_builders() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    with pytest.raises(TypeError, match="NoSlots is not a slots dataclass"):
        positional_builder(NoSlots)
