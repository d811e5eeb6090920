"""`selfspec_bench.paper` and `ablation`: our runs beside the paper's rows, and the verdicts' rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfspec_bench.paper import PAPER_LATENCY_REDUCTION_PCT, ours_beside_theirs, verdict
from selfspec_bench.records import group_records
from selfspec_bench.report import build_report


def test_ours_beside_theirs_gives_full_ssr_against_the_paper_row_with_and_without_loops(tmp_path: Path, record):
    records = [
        r
        for i in range(6)
        for r in (record(f"s{i}", "baseline", 10.0), record(f"s{i}", "prefix+suffix", 5.0 + 0.1 * i))
    ]
    records += [
        record("s9", "baseline", 10.0, loop=True),
        record("s9", "prefix+suffix", 9.0),  # loop: left out of the clean column
        record("t0", "baseline", 10.0, benchmark="thinker/class_synthesis"),
        record("t0", "prefix+suffix", 8.0, benchmark="thinker/class_synthesis"),
        record("u0", "baseline", 10.0, benchmark="classeval"),
        record("u0", "prefix", 9.0, benchmark="classeval"),  # no full SSR
    ]
    md, rows = ours_beside_theirs(group_records(records))
    by_bench = {r["run"].split(" / ")[1].split(",")[0]: r for r in rows}
    assert set(by_bench) == {"humaneval", "thinker/class_synthesis"}
    humaneval = by_bench["humaneval"]
    assert humaneval["latency_reduction_pct"] == pytest.approx(100 * (1 - 40.5 / 70))  # 42.1%
    assert humaneval["latency_reduction_pct_without_loops"] == pytest.approx(100 * (1 - 31.5 / 60))
    assert humaneval["n_without_loops"] == 6
    low, high = humaneval["latency_reduction_ci95"]
    assert low < humaneval["latency_reduction_pct"] < high and low > max(
        PAPER_LATENCY_REDUCTION_PCT["HumanEval"].values()
    )
    assert humaneval["paper_row"] == "HumanEval"
    assert (
        humaneval["verdict"] == humaneval["verdict_without_loops"] == "matches or beats both"
    )  # 42% against 2.9% / 14.6%
    assert by_bench["thinker/class_synthesis"]["verdict"] == "no paper row"
    text = "\n".join(md)
    assert "ours beside the paper's rows" in text and "(theirs)" in text and "HumanEval: 2.9% / 14.6%" in text


def test_a_loop_dominated_run_gets_no_all_sample_verdict(record):
    """Two of three baselines loop: the all-sample 'beats the paper' is withheld, the loop-free one stays."""
    records = [
        record("s0", "baseline", 10.0),
        record("s0", "prefix+suffix", 9.9),
        record("s1", "baseline", 10.0, loop=True),
        record("s1", "prefix+suffix", 2.0),
        record("s2", "baseline", 10.0, loop=True),
        record("s2", "prefix+suffix", 2.0),
    ]
    md, (row,) = ours_beside_theirs(group_records(records))
    assert row["latency_reduction_pct"] > 50.0 and (row["baseline_loops"], row["baseline_samples"]) == (2, 3)
    assert row["verdict"] == "not comparable (2 of 3 baselines are loops)"
    assert row["verdict_without_loops"] == "too few samples (1)"  # 1% on the one loop-free sample: no verdict
    assert "| 2 / 3 |" in "\n".join(md)


def test_a_run_where_most_baselines_give_no_answer_gets_no_verdict(record):
    """Natural lengths: two of three baselines end inside thinking; neither verdict compares them with the paper."""
    no_answer = {"answer_tokens": 0, "first_answer_token_s": None}
    records = [
        record("s0", "baseline", 10.0),
        record("s0", "prefix+suffix", 5.0),
        record("s1", "baseline", 10.0, **no_answer),
        record("s1", "prefix+suffix", 9.0, **no_answer),
        record("s2", "baseline", 10.0, **no_answer),
        record("s2", "prefix+suffix", 9.0, **no_answer),
    ]
    md, (row,) = ours_beside_theirs(group_records(records))
    assert row["baseline_no_answer"] == 2
    assert row["verdict"] == row["verdict_without_loops"] == "not comparable (2 of 3 baselines give no answer)"
    assert "| 0 / 3 | 2 |" in "\n".join(md)


def test_verdict_names_the_model_beaten():
    assert verdict(10.0, "HumanEval") == "matches or beats Qwen3.5-4B only"
    assert verdict(1.0, "HumanEval") == "below both"
    assert verdict(None, "HumanEval") == "n/a"


def test_verdict_weighs_the_interval_and_the_sample_count():
    """A paper number inside our 95% interval is within noise; under five paired samples, no verdict."""
    # HumanEval's row: Qwen3.5-4B 2.9%, Gemma-4-E4B 14.6%.
    assert verdict(0.6, "HumanEval", (-3.8, 4.8), 5) == "within noise of Qwen3.5-4B, below Gemma-4-E4B"
    assert verdict(10.0, "HumanEval", (8.0, 12.0), 40) == "beats Qwen3.5-4B, below Gemma-4-E4B"
    assert verdict(16.0, "HumanEval", (15.0, 17.0), 40) == "matches or beats both"
    assert verdict(1.0, "HumanEval", (0.0, 2.0), 40) == "below both"
    assert verdict(50.0, "HumanEval", (45.0, 55.0), 4) == "too few samples (4)"


def test_the_paper_row_table_says_how_many_samples_shared_the_gpu(record):
    """Shared samples read faster in the speculative modes, so the headline says how many there were."""

    def pair(sample, tenants):
        return [
            record(sample, "baseline", 10.0, gpu_co_tenants=tenants),
            record(sample, "prefix+suffix", 8.0, gpu_co_tenants=tenants),
        ]

    md, (row,) = ours_beside_theirs(group_records(pair("s0", 1) + pair("s1", 0) + pair("s2", None)))
    assert row["gpu_sharing"] == {"alone": 1, "shared": 1, "not recorded": 1}
    assert "| 1 / 3 (1 not recorded) |" in "\n".join(md) and "| shared GPU |" in md[4]
    md, _ = ours_beside_theirs(group_records(pair("s0", None)))
    assert "| not recorded |" in "\n".join(md)
    md, _ = ours_beside_theirs(group_records(pair("s0", 0) + pair("s1", 0)))
    assert "| 0 / 2 |" in "\n".join(md)


def test_reuse_ablation_pairs_each_run_with_its_own_baseline_beside_the_papers_row(
    tmp_path: Path, record, write_records, settings_dict
):
    """ClassEval: full SSR in the main run, prefix and suffix in a named ablation run with its own baseline.
    Each row's speedups use that run's baseline; loop samples leave the second column; the paper's row
    is there, labelled as theirs; a benchmark other than ClassEval gets no ablation row."""
    named = {**settings_dict(), "run_name": "ablation"}
    path = write_records(
        tmp_path / "runs.jsonl",
        [
            record("c0", "baseline", 10.0, benchmark="classeval"),
            record("c0", "prefix+suffix", 5.0, benchmark="classeval"),
            record("c1", "baseline", 12.0, benchmark="classeval", loop=True),
            record("c1", "prefix+suffix", 4.0, benchmark="classeval"),
            record("c0", "baseline", 20.0, benchmark="classeval", settings=named),
            record("c0", "prefix", 16.0, benchmark="classeval", settings=named),
            record("c0", "suffix", 10.0, benchmark="classeval", settings=named),
            record("h0", "baseline", 10.0),
            record("h0", "prefix", 5.0),  # HumanEval: not the paper's ablation row
        ],
    )
    out = tmp_path / "rep"
    build_report([path], out)
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["run"]: r for r in summary["reuse_ablation"]}
    assert set(rows) == {
        "tiny / classeval, draft budget 100, float32",
        "tiny / classeval, draft budget 100, float32, run ablation",
    }
    main, ablation = (
        rows["tiny / classeval, draft budget 100, float32"],
        rows["tiny / classeval, draft budget 100, float32, run ablation"],
    )
    assert main["speedup"] == {"prefix+suffix": pytest.approx((2.0 + 3.0) / 2)}
    assert main["speedup_without_loops"] == {"prefix+suffix": pytest.approx(2.0)} and main["n_without_loops"] == 1
    assert main["baseline_loops"] == 1 and not main["loop_dominated"]  # 1 of 2 is not more than half
    assert ablation["speedup"] == {"prefix": pytest.approx(1.25), "suffix": pytest.approx(2.0)}
    text = (out / "report.md").read_text()
    assert "## Reuse ablation on ClassEval: ours beside the paper's" in text
    assert "| paper: Gemma-4-E4B (theirs) | – | – | 1.086x | 1.318x | 1.318x | – |" in text
    assert "| tiny / classeval, draft budget 100, float32, run ablation | 1 | 0 / 1 | 1.250x | 2.000x | – |" in text
