"""`benchmarks/batch_host_time.py` measures the host's part of a decode step per batch size and
writes its records; bad sizes are refused."""

from __future__ import annotations

import json

import pytest


def test_batch_host_time_writes_one_row_per_batch(tmp_path, repo_script):
    module = repo_script("benchmarks/batch_host_time.py")
    out = tmp_path / "bh"
    argv = ["--batches", "1,3", "--new-tokens", "8", "--repeats", "1", "--families", "llama,qwen3_5"]
    assert module.main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "batch_host.json").read_text())
    assert [(row["family"], row["batch"]) for row in result["rows"]] == [
        ("llama", 1),
        ("llama", 3),
        ("qwen3_5", 1),
        ("qwen3_5", 3),
    ]
    for row in result["rows"]:
        assert row["steps"] >= 8 and row["step_ms"] > 0 and row["pack_us_per_step"] > 0
        assert row["propose_us_per_step"] > 0 and row["commit_us_per_step"] > 0
    assert "| qwen3_5 | 3 |" in (out / "batch_host.md").read_text()


@pytest.mark.parametrize("bad", [["--batches", "0"], ["--repeats", "0"], ["--new-tokens", "0"]])
def test_batch_host_time_refuses_empty_work(tmp_path, repo_script, bad):
    module = repo_script("benchmarks/batch_host_time.py")
    with pytest.raises(SystemExit) as err:
        module.main([*bad, "--out", str(tmp_path)])
    assert err.value.code == 2
