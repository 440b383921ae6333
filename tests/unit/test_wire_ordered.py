"""A job's ``ordered`` crosses the wire to a gateway as it was given (the gateway routes
it), and is left out where it is False, so that a gateway older than it accepts the job."""

from __future__ import annotations

import pytest

from plunder.model import JobSpec
from plunder.wire import WireError
from plunder.wire_specs import spec_in, spec_out


@pytest.mark.parametrize("ordered", [True, "stop", "continue"])
def test_ordered_goes_over_the_wire(ordered: bool | str) -> None:
    spec = JobSpec("t", [1], queue="q", partition_key="k", ordered=ordered)
    assert spec_out(spec)["ordered"] == ordered
    assert spec_in(spec_out(spec)) == spec


def test_an_unordered_job_says_nothing_of_it() -> None:
    spec = JobSpec("t", [1], queue="q")
    assert "ordered" not in spec_out(spec)
    assert spec_in(spec_out(spec)) == spec


def test_a_malformed_ordered_is_refused() -> None:
    data = {**spec_out(JobSpec("t")), "ordered": 3}
    with pytest.raises(WireError):
        spec_in(data)
