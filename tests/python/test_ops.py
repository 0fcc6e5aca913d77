"""The plugin loads into Python with torch.ops.load_library and its ops run."""
import os

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def plugin():
    torch.ops.load_library(os.environ["CONVEYOR_LIB"])


def test_schedule_text_round_trips_through_validate_and_simulate():
    text = torch.ops.conveyor.schedule("1f1b", 4, 8)
    assert text.splitlines()[0] == "# schedule 1f1b stages=4 microbatches=8"
    assert text.splitlines()[4].split()[:2] == ["3F0", "3B0"]
    torch.ops.conveyor.validate_schedule(text)
    makespan, bubble, peak = torch.ops.conveyor.simulate(text, [1.0] * 4, [2.0] * 4)
    assert makespan == pytest.approx(11 * 3.0)
    assert bubble == pytest.approx(3 / 11)
    assert peak == [4, 3, 2, 1]


def test_the_v_schedules_memory_caps():
    assert [torch.ops.conveyor.v_memory_cap(name, 6) for name in ("zb-v", "v-half", "v-min")] == [12.0, 7.0, 5.0]
    with pytest.raises(ValueError, match="no V schedule is called '1f1b'"):
        torch.ops.conveyor.v_memory_cap("1f1b", 6)


def test_errors_arrive_as_python_exceptions():
    with pytest.raises(ValueError, match="backward before its forward 0F0"):
        torch.ops.conveyor.validate_schedule("0B0 0F0\n")
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'"):
        torch.ops.conveyor.schedule("zigzag", 2, 2)


def test_count_nonfinite():
    t = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    assert torch.ops.conveyor.count_nonfinite([t, torch.ones(3)]).item() == 2
    assert torch.ops.conveyor.version()
