"""`selfspec_bench.records`: loading, deduplication, grouping and the bootstrap interval, on synthetic records."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from selfspec_bench.jsonl import append_jsonl
from selfspec_bench.modes import BenchSettings
from selfspec_bench.records import ReportError, group_records, latency_reduction_ci, load_records
from selfspec_bench.report import build_report
from selfspec_bench.runner import completed_pairs


def test_missing_file_no_inputs_and_corrupt_middle_line(tmp_path: Path, record):
    with pytest.raises(ReportError, match="not found"):
        load_records([tmp_path / "nope.jsonl"])
    with pytest.raises(ReportError, match="no input files"):
        load_records([])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{broken\n" + json.dumps(record("s0", "baseline", 1.0)) + "\n")
    with pytest.raises(ReportError, match="bad.jsonl:1"):
        load_records([bad])


def test_a_killed_writers_torn_line_is_dropped_before_the_next_records(tmp_path: Path, record, write_records):
    """A run killed mid-write leaves an unfinished last line; the next append removes it, so the
    report (which skips a bad *last* line only) reads the resumed file, and a whole last record
    that merely lacks its newline is kept."""
    path = write_records(tmp_path / "r.jsonl", [record("s0", "baseline", 2.0)], tail='{"sample_id": "s1", "mo')
    append_jsonl(path, [record("s1", "baseline", 2.0), record("s1", "prefix", 1.0)])
    assert [r["sample_id"] for r in load_records([path])] == ["s0", "s1", "s1"]
    assert path.read_text().count("\n") == 3
    whole = tmp_path / "whole.jsonl"
    whole.write_text(json.dumps(record("s0", "baseline", 2.0)))  # no newline at the end
    append_jsonl(whole, [record("s0", "prefix", 1.0)])
    assert [r["mode"] for r in load_records([whole])] == ["baseline", "prefix"]
    only_torn = tmp_path / "torn.jsonl"
    only_torn.write_text('{"sample_id": "s0", "mo')
    append_jsonl(only_torn, [record("s0", "baseline", 2.0)])
    assert only_torn.read_text() == json.dumps(record("s0", "baseline", 2.0)) + "\n"


def test_a_bad_line_followed_only_by_blank_lines_is_the_last_line(tmp_path: Path, record, write_records):
    path = write_records(tmp_path / "r.jsonl", [record("s0", "baseline", 2.0)], tail='{"sample_id": "s1", "mo\n\n')
    assert len(load_records([path])) == 1
    path.write_text(path.read_text() + json.dumps(record("s1", "baseline", 1.0)) + "\n")
    with pytest.raises(ReportError, match="r.jsonl:2: not JSON"):
        load_records([path])


def test_fp32_and_bf16_runs_get_their_own_tables(tmp_path, record, write_records):
    """Same settings in two dtypes: two groups, neither record replaces the other."""
    path = write_records(
        tmp_path / "two.jsonl",
        [
            record("s0", "baseline", 2.0),
            record("s0", "prefix", 1.0),
            record("s0", "baseline", 1.0, dtype="bfloat16"),
            record("s0", "prefix", 0.8, dtype="bfloat16"),
        ],
    )
    records = load_records([path])
    assert len(records) == 4
    groups = group_records(records)
    assert [g.settings["dtype"] for g in groups] == ["bfloat16", "float32"]
    assert groups[0].title.endswith(", bfloat16") and groups[0].table()["prefix"]["mean_latency_s"] == 0.8


def test_a_named_run_pairs_with_its_own_baseline_and_gets_its_own_table(tmp_path, record, write_records, settings_dict):
    """An ablation re-running the baseline beside modes the committed run lacks (`bench --run-name`):
    its baseline must not replace the committed run's, nor pair with that run's modes."""
    named = {**settings_dict(), "run_name": "ablation"}
    path = write_records(
        tmp_path / "runs.jsonl",
        [
            record("s0", "baseline", 10.0),
            record("s0", "prefix+suffix", 5.0),
            record("s0", "baseline", 12.0, settings=named),
            record("s0", "suffix", 6.0, settings=named),
        ],
    )
    records = load_records([path])
    assert len(records) == 4  # neither baseline replaces the other
    groups = {g.title: g for g in group_records(records)}
    plain, ablation = (
        groups["tiny / humaneval, draft budget 100, float32"],
        groups["tiny / humaneval, draft budget 100, float32, run ablation"],
    )
    assert plain.table()["prefix+suffix"]["speedup"] == pytest.approx(2.0)
    assert ablation.table()["suffix"]["speedup"] == pytest.approx(2.0) and "prefix+suffix" not in ablation.table()
    # Unnamed settings serialise as before (older files still resume); a named run resumes only its own records.
    assert (
        "run_name" not in BenchSettings().to_dict()
        and BenchSettings(run_name="ablation").to_dict()["run_name"] == "ablation"
    )
    assert completed_pairs(path, "tiny", named, "float32") == {("s0", "baseline"), ("s0", "suffix")}
    assert completed_pairs(path, "tiny", settings_dict(), "float32") == {("s0", "baseline"), ("s0", "prefix+suffix")}


def test_gzipped_inputs_read_like_plain_ones(tmp_path, record, write_records):
    records = [record("s0", "baseline", 2.0), record("s0", "prefix", 1.0)]
    plain = write_records(tmp_path / "r.jsonl", records)
    packed = tmp_path / "r2.jsonl.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write(plain.read_text())
    assert load_records([packed]) == load_records([plain])


def test_a_model_run_from_a_local_directory_is_named_by_the_directory(tmp_path, record, write_records):
    """A device run of `/tmp/out/x/smollm2-thinker-v3` and a run of the registered name are one
    model in the report; its title and plot names carry no machine path."""
    path = write_records(
        tmp_path / "d.jsonl",
        [
            record("s0", "baseline", 2.0, model="/tmp/out/x/smollm2-thinker-v3"),
            record("s0", "prefix", 1.0, model="/tmp/out/x/smollm2-thinker-v3/"),
            record("s1", "baseline", 2.0, model="smollm2-thinker-v3"),
            record("s1", "prefix", 1.0, model="smollm2-thinker-v3"),
        ],
    )
    groups = group_records(load_records([path]))
    assert len(groups) == 1 and groups[0].model == "smollm2-thinker-v3" and groups[0].table()["prefix"]["n"] == 2
    text = build_report([path], tmp_path / "out").read_text()
    assert "/tmp/out" not in text.split("Run metadata")[0]


def test_latency_reduction_interval_is_seeded_and_paired():
    pairs = [(10.0, 5.0), (10.0, 6.0), (20.0, 10.0), (10.0, 9.0), (10.0, 4.0)]
    low, high = latency_reduction_ci(pairs)
    assert latency_reduction_ci(pairs) == (low, high)  # same report every rebuild
    assert low < 100 * (1 - 34 / 60) < high and 0 < low and high < 100
    # Same ratio in every sample: no spread, whatever the sample sizes.
    assert latency_reduction_ci([(10.0, 5.0), (2.0, 1.0), (30.0, 15.0)]) == pytest.approx((50.0, 50.0))
    assert latency_reduction_ci([(10.0, 5.0)]) is None


def test_a_budget_sweeps_tables_come_in_budget_order(tmp_path, record, write_records):
    """Budgets sort as numbers (50 before 100 before 600), not as the text of their settings."""
    path = write_records(
        tmp_path / "sweep.jsonl",
        [
            r
            for budget in (600, 100, 50)
            for r in (record("s0", "baseline", 2.0, budget=budget), record("s0", "prefix", 1.0, budget=budget))
        ],
    )
    groups = group_records(load_records([path]))
    assert [g.settings["draft_budget"] for g in groups] == [50, 100, 600]
