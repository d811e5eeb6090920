"""`selfspec_bench.host_split`: each mode's device and host time per forward, by phase, with stalls."""

from __future__ import annotations

import pytest

from selfspec_bench.host_split import host_lines, host_split
from selfspec_bench.records import Group


def _record(mode: str, forwards: int, gpu_s: float, host_s: float, phases=None, stalls=()) -> dict:
    schedule = {"forwards": forwards, "gpu_s": gpu_s, "host_s": host_s}
    if stalls:
        schedule["stalls"] = [[i, ms] for i, ms in stalls]
    record = {"mode": mode, "sample_id": f"s{forwards}", "schedule": schedule}
    if phases is not None:
        record["host_ms"] = dict(zip(("propose", "commit", "policies", "outside"), phases))
    return record


def test_modes_are_summed_per_forward_with_phases_weighted_by_forwards():
    group = Group(
        "m",
        "b",
        {},
        [
            _record("auto", 100, 0.15, 0.02, (0.05, 0.06, 0.07, 0.02), stalls=[(40, 480.0)]),
            _record("auto", 300, 0.45, 0.03, (0.01, 0.02, 0.03, 0.04)),
            _record("baseline", 200, 0.28, 0.01),
            {"mode": "baseline", "sample_id": "x"},  # no schedule: left out
        ],
    )
    split = host_split(group)
    assert list(split) == ["baseline", "auto"]
    auto = split["auto"]
    assert auto["forwards"] == 400
    assert auto["gpu_ms_per_forward"] == pytest.approx(1.5)
    assert auto["host_ms_per_forward"] == pytest.approx(0.125)
    assert auto["phases_ms"]["propose"] == pytest.approx((0.05 * 100 + 0.01 * 300) / 400)
    assert auto["phases_ms"]["outside"] == pytest.approx((0.02 * 100 + 0.04 * 300) / 400)
    assert (auto["stalls"], auto["longest_stall_ms"]) == (1, 480.0)
    assert split["baseline"]["phases_ms"] is None and split["baseline"]["longest_stall_ms"] is None
    table = "\n".join(host_lines(split))
    assert "| auto " in table and "480.0" in table and "0.125" in table


def test_a_run_without_schedules_gets_no_table():
    group = Group("m", "b", {}, [{"mode": "baseline", "sample_id": "a"}])
    assert host_split(group) == {} and host_lines({}) == []


def test_a_batched_run_counts_its_one_schedule_once():
    """Concurrency runs keep the batch's schedule on its first record (`batch_schedule`)."""
    carrier = {"mode": "auto", "sample_id": "a", "batch_schedule": {"forwards": 50, "gpu_s": 0.1, "host_s": 0.01}}
    carrier["host_ms"] = {"propose": 0.1, "commit": 0.2, "policies": 0.05, "outside": 0.05}
    others = [{"mode": "auto", "sample_id": s, "host_ms": carrier["host_ms"]} for s in ("b", "c")]
    split = host_split(Group("m", "b", {}, [carrier, *others]))
    assert split["auto"]["forwards"] == 50
    assert split["auto"]["gpu_ms_per_forward"] == pytest.approx(2.0)
    assert split["auto"]["phases_ms"]["commit"] == pytest.approx(0.2)


def test_steps_are_also_split_by_the_rows_they_fed():
    """A drafting request's steps with its draft beside it are weighed apart from its steps alone."""
    a = _record("auto", 100, 0.15, 0.02, (0.05, 0.06, 0.07, 0.02))
    a["host_ms_by_rows"] = {
        "1": {"steps": 60, "propose": 0.04, "commit": 0.05, "policies": 0.01, "outside": 0.02},
        "2": {"steps": 40, "propose": 0.08, "commit": 0.06, "policies": 0.05, "outside": 0.02},
    }
    b = _record("auto", 50, 0.07, 0.01, (0.05, 0.06, 0.07, 0.02))
    b["host_ms_by_rows"] = {"2": {"steps": 10, "propose": 0.18, "commit": 0.06, "policies": 0.05, "outside": 0.02}}
    split = host_split(Group("m", "b", {}, [a, b, _record("prompt-lookup", 80, 0.1, 0.01)]))
    rows = split["auto"]["by_rows"]
    assert list(rows) == ["1", "2"]
    assert rows["1"]["steps"] == 60 and rows["1"]["propose"] == pytest.approx(0.04)
    assert rows["2"]["steps"] == 50 and rows["2"]["propose"] == pytest.approx((0.08 * 40 + 0.18 * 10) / 50)
    assert split["prompt-lookup"]["by_rows"] == {}
    table = "\n".join(host_lines(split))
    assert "by the rows the step fed" in table and "| auto " in table
