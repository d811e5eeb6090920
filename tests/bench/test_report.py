"""`selfspec_bench.report`: exact figures from synthetic records, plots on disk, clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from selfspec_bench.records import ReportError
from selfspec_bench.report import build_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def report(tmp_path: Path, record, write_records, settings_dict):
    """Three samples; s2's baseline loops; prefix s0 re-run (the later file must win)."""
    old = [record("s0", "prefix", 100.0)]  # stale: replaced by the record in the second file
    new = [
        record("s0", "baseline", 10.0),
        record("s1", "baseline", 20.0),
        record("s2", "baseline", 30.0, loop=True),
        record("s0", "prefix", 5.0, accepted_prefix=10, suffix_accepted_tokens=4, passed=True),
        record("s1", "prefix", 10.0, accepted_prefix=20, suffix_accepted_tokens=8, exact_match=False, passed=False),
        record("s2", "prefix", 30.0, accepted_prefix=60, oracle_speedup=3.0, loop=True),
        # transformers generate: no timing split, no oracle field -> derived from token counts.
        {
            "sample_id": "s0",
            "benchmark": "humaneval",
            "mode": "hf-generate",
            "model": "tiny",
            "dtype": "float32",
            "settings": settings_dict(),
            "latency_s": 8.0,
            "cot_tokens": 100,
            "answer_tokens": 100,
            "exact_match": True,
        },
        # a second budget of the same settings: shares the budget plot, gets its own table.
        record("s0", "baseline", 10.0, budget=200),
        record("s0", "prefix", 4.0, budget=200),
        # a model with no baseline at all.
        record("s0", "prefix", 7.0, model="other"),
    ]
    f1 = write_records(tmp_path / "a.jsonl", old)
    f2 = write_records(tmp_path / "b.jsonl", new, tail='{"sample_id": "s3", "mo')  # a line still being written
    out = tmp_path / "rep"
    path = build_report([f1, f2], out)
    summary = json.loads((out / "summary.json").read_text())
    groups = {(g["model"], g["settings"]["draft_budget"]): g for g in summary["groups"]}
    return path, out, summary, groups


def test_paired_speedup_reduction_and_oracle_fraction(report):
    _, _, summary, groups = report
    assert summary["n_records"] == 10  # 11 written, the stale prefix s0 deduplicated away
    table = groups[("tiny", 100)]["modes"]
    assert list(table) == ["baseline", "prefix", "hf-generate"]
    base, prefix, hf = table["baseline"], table["prefix"], table["hf-generate"]
    assert base["speedup"] == pytest.approx(1.0) and base["latency_reduction_pct"] == pytest.approx(0.0)
    assert prefix["n"] == 3 and prefix["n_paired"] == 3
    assert prefix["mean_latency_s"] == pytest.approx(15.0)
    assert prefix["speedup"] == pytest.approx((2 + 2 + 1) / 3)  # mean of per-sample ratios
    assert prefix["latency_reduction_pct"] == pytest.approx(25.0)  # 1 - 15/20
    assert prefix["mean_oracle_speedup"] == pytest.approx(7 / 3)
    assert prefix["oracle_fraction"] == pytest.approx((5 / 3 - 1) / (7 / 3 - 1))
    assert prefix["mean_accepted_prefix"] == pytest.approx(30.0)
    assert prefix["mean_suffix_accepted_tokens"] == pytest.approx(4.0)
    assert prefix["mean_first_answer_token_s"] == pytest.approx(7.6)
    assert prefix["mean_thinking_s"] == pytest.approx(7.5) and prefix["mean_answer_s"] == pytest.approx(7.5)
    assert prefix["exact_match_rate"] == pytest.approx(2 / 3)
    assert prefix["pass_rate"] == pytest.approx(0.5) and prefix["n_scored"] == 2
    assert prefix["loops"] == 1
    assert hf["speedup"] == pytest.approx(10 / 8) and hf["n_paired"] == 1
    assert hf["mean_oracle_speedup"] == pytest.approx(200 / 101)
    assert hf["mean_thinking_s"] is None and hf["mean_accepted_prefix"] is None and hf["pass_rate"] is None


def test_loop_samples_are_excluded_from_the_second_table(report):
    path, _, _, groups = report
    group = groups[("tiny", 100)]
    assert group["excluded_loop_samples"] == ["s2"]
    clean = group["modes_excluding_loops"]["prefix"]
    assert clean["n"] == 2 and clean["speedup"] == pytest.approx(2.0)
    assert clean["latency_reduction_pct"] == pytest.approx(50.0)  # 1 - 7.5/15
    assert clean["oracle_fraction"] == pytest.approx(1.0) and clean["loops"] == 0
    assert "1 of 3 samples excluded because their baseline answer is a loop" in path.read_text()


def test_mode_without_baseline_has_no_speedup(report):
    _, _, _, groups = report
    other = groups[("other", 100)]["modes"]["prefix"]
    assert other["speedup"] is None and other["latency_reduction_pct"] is None and other["oracle_fraction"] is None
    assert other["mean_latency_s"] == pytest.approx(7.0)


def test_markdown_rows_paper_numbers_metadata_and_plots(report):
    path, out, summary, groups = report
    text = path.read_text()
    assert path == out / "report.md"
    for mode in ("baseline", "prefix", "hf-generate"):
        assert f"\n| {mode} | " in text
    assert "| prefix | 3 | 15.00 | 1.667x | 25.0% |" in text
    assert "theirs, not ours" in text and "| HumanEval | 2.9% (1.030x) | 14.6% (1.171x) |" in text
    assert "prefix 1.086x, suffix 1.318x, prefix+suffix 1.318x" in text
    assert "- command: `selfspec bench -b humaneval`" in text and "- device: cpu" in text
    assert groups[("tiny", 200)]["modes"]["prefix"]["speedup"] == pytest.approx(2.5)
    budget = [b for b in summary["budget_plots"] if b["model"] == "tiny"]
    assert len(budget) == 1 and budget[0]["draft_budgets"] == [100, 200]
    pngs = [g["plots"]["latency"] for g in summary["groups"]] + [b["plot"] for b in summary["budget_plots"]]
    assert len(pngs) == 5
    # Named by model, benchmark and a hash of the settings, not by place: adding a run renames nothing.
    assert all(re.fullmatch(r"(latency|budget)_.+_[0-9a-f]{8}\.png", name) for name in pngs)
    assert len(set(pngs)) == len(pngs)
    for name in pngs:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
        assert f"]({name})" in text  # linked relative to report.md


def test_rerun_removes_plots_of_groups_no_longer_reported(tmp_path: Path, record, write_records):
    out = tmp_path / "rep"
    out.mkdir()
    stale = out / "latency_07_gone_model_humaneval.png"  # named by its place in the report: the other scheme
    stale.write_bytes(PNG_MAGIC)
    stale_hashed = out / "budget_gone_model_humaneval_0123abcd.png"
    stale_hashed.write_bytes(PNG_MAGIC)
    keep = out / "notes.png"  # not a name the report writes: left alone
    keep.write_bytes(PNG_MAGIC)
    records = [record("s0", "baseline", 2.0, oracle_speedup=1.5), record("s0", "prefix", 1.0, oracle_speedup=1.5)]
    text = build_report([write_records(tmp_path / "r.jsonl", records)], out).read_text()
    assert not stale.exists() and not stale_hashed.exists() and keep.exists()
    assert all(f"]({p.name})" in text for p in out.glob("latency_*.png"))


def test_adding_a_run_that_sorts_first_renames_no_plot(tmp_path: Path, record, write_records):
    later = [record("s0", "baseline", 2.0, model="zeta"), record("s0", "prefix", 1.0, model="zeta")]
    first = [record("s0", "baseline", 2.0, model="alpha"), record("s0", "prefix", 1.0, model="alpha")]
    out = tmp_path / "rep"
    build_report([write_records(tmp_path / "z.jsonl", later)], out)
    before = sorted(p.name for p in out.glob("*.png"))
    build_report([write_records(tmp_path / "z.jsonl", later), write_records(tmp_path / "a.jsonl", first)], out)
    after = sorted(p.name for p in out.glob("*.png"))
    assert set(before) < set(after) and len(after) == 2 * len(before)


def test_oracle_at_most_one_gives_no_fraction(tmp_path: Path, record, write_records):
    records = [record("s0", "baseline", 2.0, oracle_speedup=1.0), record("s0", "prefix", 1.0, oracle_speedup=1.0)]
    out = tmp_path / "rep"
    build_report([write_records(tmp_path / "r.jsonl", records)], out)
    prefix = json.loads((out / "summary.json").read_text())["groups"][0]["modes"]["prefix"]
    assert prefix["speedup"] == pytest.approx(2.0) and prefix["oracle_fraction"] is None


def test_runs_that_end_inside_thinking_are_counted_and_the_first_answer_mean_says_over_how_many(
    tmp_path: Path, record, write_records
):
    """Natural lengths: a model that stops (EOS) before closing thinking has no answer and no
    first answer token; the table counts such runs instead of averaging only the others silently."""
    no_answer = {"answer_tokens": 0, "first_answer_token_s": None, "thinking_closed_by": ""}
    records = [
        record("s0", "baseline", 2.0),
        record("s1", "baseline", 1.0, **no_answer),
        record("s0", "prefix", 1.0),
        record("s1", "prefix", 1.0, **no_answer),
    ]
    out = tmp_path / "rep"
    md = build_report([write_records(tmp_path / "r.jsonl", records)], out).read_text()
    modes = json.loads((out / "summary.json").read_text())["groups"][0]["modes"]
    assert modes["baseline"]["no_answer"] == 1 and modes["prefix"]["no_answer"] == 1
    assert "| loops | no answer | forced past end-of-text |" in md
    baseline_row = next(line for line in md.splitlines() if line.startswith("| baseline |"))
    assert "1.10 (1 answered)" in baseline_row and baseline_row.endswith("| 0 | 1 | n/a |")


@pytest.mark.parametrize("content", ["", "\n\n", '{"sample_id": "s0", "mo'])
def test_empty_input_is_a_clear_error(tmp_path: Path, content: str):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ReportError, match="no bench records"):
        build_report([path], tmp_path / "rep")
    assert not (tmp_path / "rep" / "report.md").exists()


def test_pass_rate_is_also_given_for_answers_cut_at_their_end_of_text(tmp_path, record, write_records):
    """Answers forced past the model's own end-of-text are graded whole and cut there; the table
    gives both, and a run with nothing forced shows the one rate it has."""
    path = write_records(
        tmp_path / "eos.jsonl",
        [
            record("s0", "baseline", 2.0, passed=False, passed_at_eos=True, forced_past_eos=90),
            record("s1", "baseline", 2.0, passed=False, passed_at_eos=False, forced_past_eos=0),
            record("s0", "baseline", 2.0, model="natural", passed=True, passed_at_eos=True, forced_past_eos=0),
        ],
    )
    out = tmp_path / "rep"
    text = build_report([path], out).read_text()
    assert "| 0% (2); cut at its end-of-text 50% (2) | 0 | 0 | 45 |" in text
    assert "| 100% (1) |" in text and "100% (1); cut" not in text
    groups = {g["model"]: g for g in json.loads((out / "summary.json").read_text())["groups"]}
    base = groups["tiny"]["modes"]["baseline"]
    assert base["pass_rate_at_eos"] == 0.5 and base["mean_forced_past_eos"] == 45.0


def test_the_report_says_which_modes_decoded_ahead(tmp_path: Path, record, write_records):
    """A serial baseline (a run with schedules) is named as such; a batch's steps count once;
    records from before the field get no sentence."""
    serial = [
        {**record("s0", "baseline", 2.0), "decode_ahead_steps": None},
        {**record("s0", "prefix", 1.0), "decode_ahead_steps": None},
    ]
    out = tmp_path / "rep"
    text = build_report([write_records(tmp_path / "r.jsonl", serial)], out).read_text()
    assert "baseline serially; prefix serially." in text and "slower than the engine's own" in text
    batched = [{**record(s, "baseline", 2.0), "decode_ahead_steps": 40, "batch": 0} for s in ("s0", "s1")] + [
        {**record(s, "prefix", 1.0), "decode_ahead_steps": 0, "batch": 0} for s in ("s0", "s1")
    ]
    text = build_report([write_records(tmp_path / "b.jsonl", batched)], tmp_path / "rep2").read_text()
    assert "baseline 40 steps ahead; prefix 0 steps ahead." in text and "slower than" not in text
    old = [record("s0", "baseline", 2.0), record("s0", "prefix", 1.0)]
    text = build_report([write_records(tmp_path / "o.jsonl", old)], tmp_path / "rep3").read_text()
    assert "engine.decode_ahead" not in text
