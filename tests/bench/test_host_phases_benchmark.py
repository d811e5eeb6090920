"""`benchmarks/host_phases.py` splits each mode's host time per step by phase and rows, on the
thinker (short caps), and finds every mode's output identical."""

from __future__ import annotations

import json

import pytest


def test_host_phases_splits_the_thinker_steps_by_phase_and_rows(tmp_path, repo_script):
    module = repo_script("benchmarks/host_phases.py")
    out = tmp_path / "hp"
    args = ["--modes", "prompt-lookup,auto", "--repeats", "1", "--cot-cap", "40", "--answer-cap", "24"]
    args += ["--draft-budget", "16", "--max-draft", "24", "--out", str(out)]
    assert module.main(args) == 0
    result = json.loads((out / "host_phases.json").read_text())
    assert [run["mode"] for run in result["runs"]] == ["prompt-lookup", "auto"]
    for run in result["runs"]:
        assert run["exact"] is True
        split = run["by_phase_rows"]
        assert "thinking/1" in split and "answer/1" in split, split
        for entry in split.values():
            assert entry["steps"] > 0 and entry["propose_median_us"] > 0 and entry["step_median_ms"] > 0
    assert "| auto |" in (out / "host_phases.md").read_text()


def test_host_phases_refuses_a_run_of_nothing(tmp_path, repo_script):
    module = repo_script("benchmarks/host_phases.py")
    with pytest.raises(SystemExit) as err:
        module.main(["--repeats", "0", "--out", str(tmp_path)])
    assert err.value.code == 2
