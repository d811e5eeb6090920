"""`selfspec_bench.run_checks` and their tables: what breaks a like-with-like pairing, and where exactness broke."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfspec_bench.records import group_records
from selfspec_bench.report import build_report
from selfspec_bench.run_checks import divergence_summary, exactness_by_source
from selfspec_bench.tables import divergence_lines, exactness_by_source_lines


def test_divergence_summary_counts_phases_and_shapes(record):
    def rec(sid, mode, index=None, phase=None, shape=None, base=None):
        r = record(sid, mode, 10.0)
        if mode != "baseline":
            r.update(first_divergence=index, first_divergence_phase=phase)
            if shape:
                r.update(first_divergence_shape=shape, baseline_shape_at_divergence=base)
        return r

    records = [rec(s, "baseline") for s in ("s0", "s1", "s2")] + [
        rec("s0", "prompt-lookup", 7, "answer", "1x16/k2048", "1x1/k2048"),
        rec("s1", "prompt-lookup", 3, "cot", "1x16/k1024", "1x1/k1024"),
        rec("s2", "prompt-lookup"),  # stayed exact
        rec("s0", "prefix+suffix", 5, "cot"),  # written before shapes were recorded
    ]
    (group,) = group_records(records)
    summary = divergence_summary(group)
    assert summary["prompt-lookup"] == {
        "compared": 3,
        "left_baseline": 2,
        "in_cot": 1,
        "in_answer": 1,
        "shapes": [{"mode_shape": "1x16", "baseline_shape": "1x1", "count": 2}],
    }
    assert summary["prefix+suffix"]["shapes"] == [{"mode_shape": "?", "baseline_shape": "?", "count": 1}]
    text = "\n".join(divergence_lines(summary))
    assert "| prompt-lookup | 2 / 3 | 1 | 1 | 1x16 ← 1x1: 2 |" in text
    assert divergence_lines({}) == []


def test_exact_match_is_split_by_package_source_when_a_run_mixes_versions(record):
    """A resumed file can span engine versions: the report gives each version's exact-match count."""

    def rec(sid, mode, exact=None, source=None):
        r = record(sid, mode, 10.0)
        if mode != "baseline":
            r["exact_match"] = exact
        if source:
            r["versions"] = {"selfspec_source": source}
        return r

    records = [rec(s, "baseline") for s in ("s0", "s1", "s2")] + [
        rec("s0", "prompt-lookup", True),
        rec("s1", "prompt-lookup", False, "abc123"),
        rec("s2", "prompt-lookup", True, "abc123"),
        rec("s2", "prefix+suffix", True, "abc123"),
    ]
    (group,) = group_records(records)
    by_source = exactness_by_source(group)
    assert by_source == {
        "before hashes": {"prompt-lookup": (1, 1)},
        "abc123": {"prompt-lookup": (1, 2), "prefix+suffix": (1, 1)},
    }
    text = "\n".join(exactness_by_source_lines(by_source))
    assert "| abc123 | 1 / 1 | 1 / 2 |" in text and "| before hashes | – | 1 / 1 |" in text
    one_version = {"abc123": by_source["abc123"]}
    assert exactness_by_source_lines(one_version) == []  # nothing to split


def test_timing_check_flags_a_batch_that_ran_slow_per_forward(tmp_path: Path, record, write_records):
    """A first batch whose baseline paid for warm-up is flagged; the paired speedups it
    would flatter are named in the report."""
    records = []
    for i in range(8):  # concurrency 2: four batches of two samples
        slow = 1.8 if i < 2 else 1.0
        records.append(record(f"s{i}", "baseline", 10.0 * slow, forwards=1000))
        records.append(record(f"s{i}", "prefix+suffix", 10.0, forwards=1000))
    for r in records:
        r["settings"] = {**r["settings"], "concurrency": 2}
    path = build_report([write_records(tmp_path / "t.jsonl", records)], tmp_path / "out")
    text = path.read_text()
    assert "Timing check" in text and "baseline, batch 0 (samples 0–1 in run order): 18.00 ms per forward" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    flagged = summary["groups"][0]["timing_check"]["flagged"]
    assert [(f["mode"], f["batch"]) for f in flagged] == [("baseline", 0)]
    even = [dict(r, latency_s=10.0) for r in records]
    clean = build_report([write_records(tmp_path / "e.jsonl", even)], tmp_path / "out2").read_text()
    assert "Timing check" not in clean


def test_time_per_forward_by_place_in_the_run_order(tmp_path: Path, record, write_records):
    """With the order rotated, a place that costs more shows in every mode (a mode always run
    first, as the baseline once was, can run ~9% slower per forward there)."""
    records = [
        record("s0", "baseline", 1.1, forwards=100, run_position=1),
        record("s0", "prefix", 1.0, forwards=100, run_position=2),
        record("s1", "prefix", 1.1, forwards=100, run_position=1),
        record("s1", "baseline", 1.0, forwards=100, run_position=2),
    ]
    out = tmp_path / "rep"
    md = build_report([write_records(tmp_path / "r.jsonl", records)], out).read_text()
    check = json.loads((out / "summary.json").read_text())["groups"][0]["run_position_check"]
    assert check["baseline"]["1"] == {"n": 1, "median_ms_per_forward": pytest.approx(11.0)}
    assert check["prefix"]["2"]["median_ms_per_forward"] == pytest.approx(10.0)
    assert "### Time per forward by place in the run order" in md
    assert "| baseline | 11.000 (1) | 10.000 (1) |" in md
    # records from before run_position: no table
    old = [{k: v for k, v in r.items() if k != "run_position"} for r in records]
    assert (
        "by place in the run order"
        not in build_report([write_records(tmp_path / "o.jsonl", old)], tmp_path / "o").read_text()
    )


def test_place_tables_split_by_the_per_sample_warm_up(tmp_path: Path, record, write_records):
    """Records with and without the per-sample warm-up get a place table each, so a run resumed
    across the change shows whether the warm-up removed the first place's cost."""
    cold = [
        record("s0", "baseline", 1.2, forwards=100, run_position=1),
        record("s0", "prefix", 1.0, forwards=100, run_position=2),
    ]
    warm = [
        record("s1", "prefix", 1.0, forwards=100, run_position=1, group_warm_up=True),
        record("s1", "baseline", 1.0, forwards=100, run_position=2, group_warm_up=True),
    ]
    md = build_report([write_records(tmp_path / "r.jsonl", cold + warm)], tmp_path / "rep").read_text()
    without = md.index("samples without the per-sample warm-up")
    with_ = md.index("samples with the per-sample warm-up")
    assert "| baseline | 12.000 (1) | – |" in md[without:with_]
    assert "| baseline | – | 10.000 (1) |" in md[with_:]
    # one kind only: one table, no label
    only_warm = build_report([write_records(tmp_path / "w.jsonl", warm)], tmp_path / "w").read_text()
    assert "### Time per forward by place in the run order\n" in only_warm


def test_samples_that_shared_the_gpu_get_their_own_columns(tmp_path: Path, record, write_records):
    """A resumed run may hold samples that had the GPU alone and samples that shared it (two
    bench processes on one GPU: ~2x per forward): the report says how many shared it and gives
    time per forward and paired speedup per condition."""
    records = [
        record("s0", "baseline", 1.0, forwards=100, gpu_co_tenants=0),
        record("s0", "prefix", 0.5, forwards=50, gpu_co_tenants=0),
        record("s1", "baseline", 2.0, forwards=100, gpu_co_tenants=1),
        record("s1", "prefix", 1.6, forwards=50, gpu_co_tenants=1),
        record("s2", "baseline", 1.0, forwards=100),
        record("s2", "prefix", 0.8, forwards=50),  # before the field existed
    ]
    out = tmp_path / "rep"
    md = build_report([write_records(tmp_path / "r.jsonl", records)], out).read_text()
    check = json.loads((out / "summary.json").read_text())["groups"][0]["gpu_sharing_check"]
    assert check["samples"] == {"alone": 1, "shared": 1, "not recorded": 1}
    assert check["modes"]["prefix"]["shared"] == {
        "n": 1,
        "median_ms_per_forward": pytest.approx(32.0),
        "mean_speedup": pytest.approx(1.25),
    }
    assert check["modes"]["baseline"]["alone"]["median_ms_per_forward"] == pytest.approx(10.0)
    assert "1 of 3 samples ran while other processes used the same GPU" in md
    assert "| prefix | 10.000 / 2.000x (1) | 32.000 / 1.250x (1) | 16.000 / 1.250x (1) |" in md
    # nothing shared: no section
    alone = [dict(r, gpu_co_tenants=0) for r in records]
    assert (
        "shared the GPU" not in build_report([write_records(tmp_path / "a.jsonl", alone)], tmp_path / "a").read_text()
    )


def test_a_named_rerun_of_common_samples_is_set_beside_the_unnamed_run(
    tmp_path: Path, record, write_records, settings_dict
):
    """A named run reruns samples that ran on a shared GPU, alone (`--run-name alone-check`): the
    report compares the same samples' speedups, times per forward and tokens across the runs."""
    shared = [
        record("s0", "baseline", 2.0, forwards=100, gpu_co_tenants=1, output_hash="b0"),
        record("s0", "prefix", 1.0, forwards=50, gpu_co_tenants=1, output_hash="b0"),
        record("s1", "baseline", 2.0, forwards=100, gpu_co_tenants=1, output_hash="b1"),
        record("s1", "prefix", 1.0, forwards=50, gpu_co_tenants=1, output_hash="b1"),
    ]
    alone_settings = dict(settings_dict(), run_name="alone-check")
    alone = [
        record("s0", "baseline", 1.0, forwards=100, gpu_co_tenants=0, output_hash="b0", settings=alone_settings),
        record("s0", "prefix", 0.625, forwards=50, gpu_co_tenants=0, output_hash="other", settings=alone_settings),
    ]
    out = tmp_path / "rep"
    md = build_report([write_records(tmp_path / "r.jsonl", shared + alone)], out).read_text()
    [check] = json.loads((out / "summary.json").read_text())["rerun_checks"]
    assert check["run_name"] == "alone-check" and check["n_common"] == 1
    assert check["sharing"] == {"reference": {"shared": 1}, "named": {"alone": 1}}
    prefix = check["modes"]["prefix"]
    assert prefix["reference"]["speedup"] == pytest.approx(2.0) and prefix["named"]["speedup"] == pytest.approx(1.6)
    assert prefix["named"]["median_ms_per_forward"] == pytest.approx(12.5)
    assert (prefix["same_tokens"], prefix["compared"]) == (0, 1)
    assert check["modes"]["baseline"]["same_tokens"] == 1
    assert "| prefix | 20.000 / 2.000x | 12.500 / 1.600x | -0.400 | 0 / 1 |" in md
    assert "GPU — unnamed run: 1 shared; run alone-check: 1 alone" in md
    # a named run without common samples, or without an unnamed twin: no section
    lonely = [dict(r, sample_id="s9") for r in alone]
    assert (
        "## The same samples"
        not in build_report([write_records(tmp_path / "l.jsonl", shared + lonely)], tmp_path / "l").read_text()
    )
