"""`selfspec_bench.report`: exact figures from synthetic records, plots on disk, clear errors."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from selfspec_bench.jsonl import append_jsonl
from selfspec_bench.modes import BenchSettings
from selfspec_bench.paper import PAPER_LATENCY_REDUCTION_PCT, ours_beside_theirs, verdict
from selfspec_bench.records import ReportError, group_records, latency_reduction_ci, load_records
from selfspec_bench.report import build_report
from selfspec_bench.run_checks import divergence_summary, exactness_by_source
from selfspec_bench.runner import _baseline_hashes, completed_pairs, divergence_fields, first_divergence
from selfspec_bench.tables import divergence_lines, exactness_by_source_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _settings(budget: int = 100) -> dict:
    return {
        "cot_cap": 400,
        "answer_cap": 300,
        "draft_budget": budget,
        "draft_interval": budget,
        "max_draft_len": 300,
        "fixed_length": True,
        "suffix": {"max_depth": 4},
        "suffix_sources": ["draft"],
    }


def _rec(sample: str, mode: str, latency: float, *, model: str = "tiny", budget: int = 100, **extra) -> dict:
    rec = {
        "sample_id": sample,
        "benchmark": "humaneval",
        "mode": mode,
        "model": model,
        "settings": _settings(budget),
        "device": "cpu",
        "dtype": "float32",
        "command": "selfspec bench -b humaneval",
        "date": "2026-01-02",
        "versions": {"torch": "2.x"},
        "latency_s": latency,
        "thinking_s": latency / 2,
        "first_answer_token_s": latency / 2 + 0.1,
        "cot_tokens": 100,
        "answer_tokens": 100,
        "accepted_prefix": 0,
        "suffix_accepted_tokens": 0,
        "oracle_speedup": 2.0,
        "loop": False,
        "exact_match": True,
    }
    rec.update(extra)
    return rec


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture()
def report(tmp_path: Path):
    """Three samples; s2's baseline loops; prefix s0 re-run (the later file must win)."""
    old = [_rec("s0", "prefix", 100.0)]  # stale: replaced by the record in the second file
    new = [
        _rec("s0", "baseline", 10.0),
        _rec("s1", "baseline", 20.0),
        _rec("s2", "baseline", 30.0, loop=True),
        _rec("s0", "prefix", 5.0, accepted_prefix=10, suffix_accepted_tokens=4, passed=True),
        _rec("s1", "prefix", 10.0, accepted_prefix=20, suffix_accepted_tokens=8, exact_match=False, passed=False),
        _rec("s2", "prefix", 30.0, accepted_prefix=60, oracle_speedup=3.0, loop=True),
        # transformers generate: no timing split, no oracle field -> derived from token counts.
        {
            "sample_id": "s0",
            "benchmark": "humaneval",
            "mode": "hf-generate",
            "model": "tiny",
            "dtype": "float32",
            "settings": _settings(),
            "latency_s": 8.0,
            "cot_tokens": 100,
            "answer_tokens": 100,
            "exact_match": True,
        },
        # a second budget of the same settings: shares the budget plot, gets its own table.
        _rec("s0", "baseline", 10.0, budget=200),
        _rec("s0", "prefix", 4.0, budget=200),
        # a model with no baseline at all.
        _rec("s0", "prefix", 7.0, model="other"),
    ]
    f1 = _write(tmp_path / "a.jsonl", old)
    f2 = _write(tmp_path / "b.jsonl", new, tail='{"sample_id": "s3", "mo')  # a line still being written
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


def test_rerun_removes_plots_of_groups_no_longer_reported(tmp_path: Path):
    out = tmp_path / "rep"
    out.mkdir()
    stale = out / "latency_07_gone_model_humaneval.png"  # named by its place in the report: the other scheme
    stale.write_bytes(PNG_MAGIC)
    stale_hashed = out / "budget_gone_model_humaneval_0123abcd.png"
    stale_hashed.write_bytes(PNG_MAGIC)
    keep = out / "notes.png"  # not a name the report writes: left alone
    keep.write_bytes(PNG_MAGIC)
    records = [_rec("s0", "baseline", 2.0, oracle_speedup=1.5), _rec("s0", "prefix", 1.0, oracle_speedup=1.5)]
    text = build_report([_write(tmp_path / "r.jsonl", records)], out).read_text()
    assert not stale.exists() and not stale_hashed.exists() and keep.exists()
    assert all(f"]({p.name})" in text for p in out.glob("latency_*.png"))


def test_adding_a_run_that_sorts_first_renames_no_plot(tmp_path: Path):
    later = [_rec("s0", "baseline", 2.0, model="zeta"), _rec("s0", "prefix", 1.0, model="zeta")]
    first = [_rec("s0", "baseline", 2.0, model="alpha"), _rec("s0", "prefix", 1.0, model="alpha")]
    out = tmp_path / "rep"
    build_report([_write(tmp_path / "z.jsonl", later)], out)
    before = sorted(p.name for p in out.glob("*.png"))
    build_report([_write(tmp_path / "z.jsonl", later), _write(tmp_path / "a.jsonl", first)], out)
    after = sorted(p.name for p in out.glob("*.png"))
    assert set(before) < set(after) and len(after) == 2 * len(before)


def test_oracle_at_most_one_gives_no_fraction(tmp_path: Path):
    records = [_rec("s0", "baseline", 2.0, oracle_speedup=1.0), _rec("s0", "prefix", 1.0, oracle_speedup=1.0)]
    out = tmp_path / "rep"
    build_report([_write(tmp_path / "r.jsonl", records)], out)
    prefix = json.loads((out / "summary.json").read_text())["groups"][0]["modes"]["prefix"]
    assert prefix["speedup"] == pytest.approx(2.0) and prefix["oracle_fraction"] is None


def test_runs_that_end_inside_thinking_are_counted_and_the_first_answer_mean_says_over_how_many(tmp_path: Path):
    """Natural lengths: a model that stops (EOS) before closing thinking has no answer and no
    first answer token; the table counts such runs instead of averaging only the others silently."""
    no_answer = {"answer_tokens": 0, "first_answer_token_s": None, "thinking_closed_by": ""}
    records = [
        _rec("s0", "baseline", 2.0),
        _rec("s1", "baseline", 1.0, **no_answer),
        _rec("s0", "prefix", 1.0),
        _rec("s1", "prefix", 1.0, **no_answer),
    ]
    out = tmp_path / "rep"
    md = build_report([_write(tmp_path / "r.jsonl", records)], out).read_text()
    modes = json.loads((out / "summary.json").read_text())["groups"][0]["modes"]
    assert modes["baseline"]["no_answer"] == 1 and modes["prefix"]["no_answer"] == 1
    assert "| loops | no answer | forced past end-of-text |" in md
    baseline_row = next(line for line in md.splitlines() if line.startswith("| baseline |"))
    assert "1.10 (1 answered)" in baseline_row and baseline_row.endswith("| 0 | 1 | n/a |")


def test_time_per_forward_by_place_in_the_run_order(tmp_path: Path):
    """With the order rotated, a place that costs more shows in every mode (a mode always run
    first, as the baseline once was, can run ~9% slower per forward there)."""
    records = [
        _rec("s0", "baseline", 1.1, forwards=100, run_position=1),
        _rec("s0", "prefix", 1.0, forwards=100, run_position=2),
        _rec("s1", "prefix", 1.1, forwards=100, run_position=1),
        _rec("s1", "baseline", 1.0, forwards=100, run_position=2),
    ]
    out = tmp_path / "rep"
    md = build_report([_write(tmp_path / "r.jsonl", records)], out).read_text()
    check = json.loads((out / "summary.json").read_text())["groups"][0]["run_position_check"]
    assert check["baseline"]["1"] == {"n": 1, "median_ms_per_forward": pytest.approx(11.0)}
    assert check["prefix"]["2"]["median_ms_per_forward"] == pytest.approx(10.0)
    assert "### Time per forward by place in the run order" in md
    assert "| baseline | 11.000 (1) | 10.000 (1) |" in md
    # records from before run_position: no table
    old = [{k: v for k, v in r.items() if k != "run_position"} for r in records]
    assert (
        "by place in the run order" not in build_report([_write(tmp_path / "o.jsonl", old)], tmp_path / "o").read_text()
    )


def test_place_tables_split_by_the_per_sample_warm_up(tmp_path: Path):
    """Records with and without the per-sample warm-up get a place table each, so a run resumed
    across the change shows whether the warm-up removed the first place's cost."""
    cold = [
        _rec("s0", "baseline", 1.2, forwards=100, run_position=1),
        _rec("s0", "prefix", 1.0, forwards=100, run_position=2),
    ]
    warm = [
        _rec("s1", "prefix", 1.0, forwards=100, run_position=1, group_warm_up=True),
        _rec("s1", "baseline", 1.0, forwards=100, run_position=2, group_warm_up=True),
    ]
    md = build_report([_write(tmp_path / "r.jsonl", cold + warm)], tmp_path / "rep").read_text()
    without = md.index("samples without the per-sample warm-up")
    with_ = md.index("samples with the per-sample warm-up")
    assert "| baseline | 12.000 (1) | – |" in md[without:with_]
    assert "| baseline | – | 10.000 (1) |" in md[with_:]
    # one kind only: one table, no label
    only_warm = build_report([_write(tmp_path / "w.jsonl", warm)], tmp_path / "w").read_text()
    assert "### Time per forward by place in the run order\n" in only_warm


@pytest.mark.parametrize("content", ["", "\n\n", '{"sample_id": "s0", "mo'])
def test_empty_input_is_a_clear_error(tmp_path: Path, content: str):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ReportError, match="no bench records"):
        build_report([path], tmp_path / "rep")
    assert not (tmp_path / "rep" / "report.md").exists()


def test_missing_file_no_inputs_and_corrupt_middle_line(tmp_path: Path):
    with pytest.raises(ReportError, match="not found"):
        load_records([tmp_path / "nope.jsonl"])
    with pytest.raises(ReportError, match="no input files"):
        load_records([])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{broken\n" + json.dumps(_rec("s0", "baseline", 1.0)) + "\n")
    with pytest.raises(ReportError, match="bad.jsonl:1"):
        load_records([bad])


def test_a_killed_writers_torn_line_is_dropped_before_the_next_records(tmp_path: Path):
    """A run killed mid-write leaves an unfinished last line; the next append removes it, so the
    report (which skips a bad *last* line only) reads the resumed file, and a whole last record
    that merely lacks its newline is kept."""
    path = _write(tmp_path / "r.jsonl", [_rec("s0", "baseline", 2.0)], tail='{"sample_id": "s1", "mo')
    append_jsonl(path, [_rec("s1", "baseline", 2.0), _rec("s1", "prefix", 1.0)])
    assert [r["sample_id"] for r in load_records([path])] == ["s0", "s1", "s1"]
    assert path.read_text().count("\n") == 3
    whole = tmp_path / "whole.jsonl"
    whole.write_text(json.dumps(_rec("s0", "baseline", 2.0)))  # no newline at the end
    append_jsonl(whole, [_rec("s0", "prefix", 1.0)])
    assert [r["mode"] for r in load_records([whole])] == ["baseline", "prefix"]
    only_torn = tmp_path / "torn.jsonl"
    only_torn.write_text('{"sample_id": "s0", "mo')
    append_jsonl(only_torn, [_rec("s0", "baseline", 2.0)])
    assert only_torn.read_text() == json.dumps(_rec("s0", "baseline", 2.0)) + "\n"


def test_a_bad_line_followed_only_by_blank_lines_is_the_last_line(tmp_path: Path):
    path = _write(tmp_path / "r.jsonl", [_rec("s0", "baseline", 2.0)], tail='{"sample_id": "s1", "mo\n\n')
    assert len(load_records([path])) == 1
    path.write_text(path.read_text() + json.dumps(_rec("s1", "baseline", 1.0)) + "\n")
    with pytest.raises(ReportError, match="r.jsonl:2: not JSON"):
        load_records([path])


def test_resume_and_exactness_are_keyed_by_model_and_settings(tmp_path):
    path = tmp_path / "sweep.jsonl"
    a, b = {"draft_budget": 100}, {"draft_budget": 200}
    rows = [
        {"sample_id": "s1", "mode": "baseline", "model": "m", "settings": a, "output_hash": "h1"},
        {"sample_id": "s1", "mode": "prefix", "model": "m", "settings": a, "output_hash": "h1"},
        {"sample_id": "s1", "mode": "baseline", "model": "m", "settings": b, "output_hash": "h2"},
        {"sample_id": "s1", "mode": "baseline", "model": "other", "settings": a, "output_hash": "h3"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"cut')
    assert completed_pairs(path, "m", a) == {("s1", "baseline"), ("s1", "prefix")}
    assert completed_pairs(path, "m", b) == {("s1", "baseline")}
    assert _baseline_hashes(path, "m", b) == {"s1": "h2"}
    assert _baseline_hashes(path, "other", a) == {"s1": "h3"}
    # A bf16 run does not resume from fp32 records of the same settings.
    typed = tmp_path / "typed.jsonl"
    typed.write_text(json.dumps({**rows[0], "dtype": "float32"}) + "\n")
    assert completed_pairs(typed, "m", a, "bfloat16") == set()
    assert completed_pairs(typed, "m", a, "float32") == {("s1", "baseline")}


def test_fp32_and_bf16_runs_get_their_own_tables(tmp_path):
    """Same settings in two dtypes: two groups, neither record replaces the other."""
    path = _write(
        tmp_path / "two.jsonl",
        [
            _rec("s0", "baseline", 2.0),
            _rec("s0", "prefix", 1.0),
            _rec("s0", "baseline", 1.0, dtype="bfloat16"),
            _rec("s0", "prefix", 0.8, dtype="bfloat16"),
        ],
    )
    records = load_records([path])
    assert len(records) == 4
    groups = group_records(records)
    assert [g.settings["dtype"] for g in groups] == ["bfloat16", "float32"]
    assert groups[0].title.endswith(", bfloat16") and groups[0].table()["prefix"]["mean_latency_s"] == 0.8


def test_pass_rate_is_also_given_for_answers_cut_at_their_end_of_text(tmp_path):
    """Answers forced past the model's own end-of-text are graded whole and cut there; the table
    gives both, and a run with nothing forced shows the one rate it has."""
    path = _write(
        tmp_path / "eos.jsonl",
        [
            _rec("s0", "baseline", 2.0, passed=False, passed_at_eos=True, forced_past_eos=90),
            _rec("s1", "baseline", 2.0, passed=False, passed_at_eos=False, forced_past_eos=0),
            _rec("s0", "baseline", 2.0, model="natural", passed=True, passed_at_eos=True, forced_past_eos=0),
        ],
    )
    out = tmp_path / "rep"
    text = build_report([path], out).read_text()
    assert "| 0% (2); cut at its end-of-text 50% (2) | 0 | 0 | 45 |" in text
    assert "| 100% (1) |" in text and "100% (1); cut" not in text
    groups = {g["model"]: g for g in json.loads((out / "summary.json").read_text())["groups"]}
    base = groups["tiny"]["modes"]["baseline"]
    assert base["pass_rate_at_eos"] == 0.5 and base["mean_forced_past_eos"] == 45.0


def test_a_named_run_pairs_with_its_own_baseline_and_gets_its_own_table(tmp_path):
    """An ablation re-running the baseline beside modes the committed run lacks (`bench --run-name`):
    its baseline must not replace the committed run's, nor pair with that run's modes."""
    named = {**_settings(), "run_name": "ablation"}
    path = _write(
        tmp_path / "runs.jsonl",
        [
            _rec("s0", "baseline", 10.0),
            _rec("s0", "prefix+suffix", 5.0),
            _rec("s0", "baseline", 12.0, settings=named),
            _rec("s0", "suffix", 6.0, settings=named),
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
    assert completed_pairs(path, "tiny", _settings(), "float32") == {("s0", "baseline"), ("s0", "prefix+suffix")}


def test_timing_check_flags_a_batch_that_ran_slow_per_forward(tmp_path: Path):
    """A first batch whose baseline paid for warm-up is flagged; the paired speedups it
    would flatter are named in the report."""
    records = []
    for i in range(8):  # concurrency 2: four batches of two samples
        slow = 1.8 if i < 2 else 1.0
        records.append(_rec(f"s{i}", "baseline", 10.0 * slow, forwards=1000))
        records.append(_rec(f"s{i}", "prefix+suffix", 10.0, forwards=1000))
    for r in records:
        r["settings"] = {**r["settings"], "concurrency": 2}
    path = build_report([_write(tmp_path / "t.jsonl", records)], tmp_path / "out")
    text = path.read_text()
    assert "Timing check" in text and "baseline, batch 0 (samples 0–1 in run order): 18.00 ms per forward" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    flagged = summary["groups"][0]["timing_check"]["flagged"]
    assert [(f["mode"], f["batch"]) for f in flagged] == [("baseline", 0)]
    even = [dict(r, latency_s=10.0) for r in records]
    clean = build_report([_write(tmp_path / "e.jsonl", even)], tmp_path / "out2").read_text()
    assert "Timing check" not in clean


def test_gzipped_inputs_read_like_plain_ones(tmp_path):
    records = [_rec("s0", "baseline", 2.0), _rec("s0", "prefix", 1.0)]
    plain = _write(tmp_path / "r.jsonl", records)
    packed = tmp_path / "r2.jsonl.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write(plain.read_text())
    assert load_records([packed]) == load_records([plain])


def test_a_model_run_from_a_local_directory_is_named_by_the_directory(tmp_path):
    """A device run of `/tmp/out/x/smollm2-thinker-v3` and a run of the registered name are one
    model in the report; its title and plot names carry no machine path."""
    path = _write(
        tmp_path / "d.jsonl",
        [
            _rec("s0", "baseline", 2.0, model="/tmp/out/x/smollm2-thinker-v3"),
            _rec("s0", "prefix", 1.0, model="/tmp/out/x/smollm2-thinker-v3/"),
            _rec("s1", "baseline", 2.0, model="smollm2-thinker-v3"),
            _rec("s1", "prefix", 1.0, model="smollm2-thinker-v3"),
        ],
    )
    groups = group_records(load_records([path]))
    assert len(groups) == 1 and groups[0].model == "smollm2-thinker-v3" and groups[0].table()["prefix"]["n"] == 2
    text = build_report([path], tmp_path / "out").read_text()
    assert "/tmp/out" not in text.split("Run metadata")[0]


def test_ours_beside_theirs_gives_full_ssr_against_the_paper_row_with_and_without_loops(tmp_path: Path):
    records = [
        r for i in range(6) for r in (_rec(f"s{i}", "baseline", 10.0), _rec(f"s{i}", "prefix+suffix", 5.0 + 0.1 * i))
    ]
    records += [
        _rec("s9", "baseline", 10.0, loop=True),
        _rec("s9", "prefix+suffix", 9.0),  # loop: left out of the clean column
        _rec("t0", "baseline", 10.0, benchmark="thinker/class_synthesis"),
        _rec("t0", "prefix+suffix", 8.0, benchmark="thinker/class_synthesis"),
        _rec("u0", "baseline", 10.0, benchmark="classeval"),
        _rec("u0", "prefix", 9.0, benchmark="classeval"),  # no full SSR
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


def test_a_loop_dominated_run_gets_no_all_sampleverdict():
    """Two of three baselines loop: the all-sample 'beats the paper' is withheld, the loop-free one stays."""
    records = [
        _rec("s0", "baseline", 10.0),
        _rec("s0", "prefix+suffix", 9.9),
        _rec("s1", "baseline", 10.0, loop=True),
        _rec("s1", "prefix+suffix", 2.0),
        _rec("s2", "baseline", 10.0, loop=True),
        _rec("s2", "prefix+suffix", 2.0),
    ]
    md, (row,) = ours_beside_theirs(group_records(records))
    assert row["latency_reduction_pct"] > 50.0 and (row["baseline_loops"], row["baseline_samples"]) == (2, 3)
    assert row["verdict"] == "not comparable (2 of 3 baselines are loops)"
    assert row["verdict_without_loops"] == "too few samples (1)"  # 1% on the one loop-free sample: no verdict
    assert "| 2 / 3 |" in "\n".join(md)


def test_a_run_where_most_baselines_give_no_answer_gets_noverdict():
    """Natural lengths: two of three baselines end inside thinking; neither verdict compares them with the paper."""
    no_answer = {"answer_tokens": 0, "first_answer_token_s": None}
    records = [
        _rec("s0", "baseline", 10.0),
        _rec("s0", "prefix+suffix", 5.0),
        _rec("s1", "baseline", 10.0, **no_answer),
        _rec("s1", "prefix+suffix", 9.0, **no_answer),
        _rec("s2", "baseline", 10.0, **no_answer),
        _rec("s2", "prefix+suffix", 9.0, **no_answer),
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


def test_latency_reduction_interval_is_seeded_and_paired():
    pairs = [(10.0, 5.0), (10.0, 6.0), (20.0, 10.0), (10.0, 9.0), (10.0, 4.0)]
    low, high = latency_reduction_ci(pairs)
    assert latency_reduction_ci(pairs) == (low, high)  # same report every rebuild
    assert low < 100 * (1 - 34 / 60) < high and 0 < low and high < 100
    # Same ratio in every sample: no spread, whatever the sample sizes.
    assert latency_reduction_ci([(10.0, 5.0), (2.0, 1.0), (30.0, 15.0)]) == pytest.approx((50.0, 50.0))
    assert latency_reduction_ci([(10.0, 5.0)]) is None


def test_first_divergence_locates_where_a_mode_leaves_the_baseline():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2 and first_divergence([1, 2], [1, 2, 3]) == 2
    assert divergence_fields([1, 2, 3, 4], 2, [1, 2, 3, 5]) == {
        "first_divergence": 3,
        "first_divergence_phase": "answer",
    }
    assert divergence_fields([1, 2, 3, 4], 2, [0, 2, 3, 4])["first_divergence_phase"] == "cot"
    assert divergence_fields([1, 2], 1, [1, 2]) == {"first_divergence": None, "first_divergence_phase": None}
    shaped = divergence_fields([1, 2, 3], 1, [1, 2, 4], ["1x1/k32"] * 3, ["1x1/k32", "1x16/k32", "1x16/k32"])
    assert shaped["first_divergence_shape"] == "1x16/k32" and shaped["baseline_shape_at_divergence"] == "1x1/k32"


def test_divergence_summary_counts_phases_and_shapes():
    def rec(sid, mode, index=None, phase=None, shape=None, base=None):
        r = _rec(sid, mode, 10.0)
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


def test_exact_match_is_split_by_package_source_when_a_run_mixes_versions():
    """A resumed file can span engine versions: the report gives each version's exact-match count."""

    def rec(sid, mode, exact=None, source=None):
        r = _rec(sid, mode, 10.0)
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


def test_samples_that_shared_the_gpu_get_their_own_columns(tmp_path: Path):
    """A resumed run may hold samples that had the GPU alone and samples that shared it (two
    bench processes on one GPU: ~2x per forward): the report says how many shared it and gives
    time per forward and paired speedup per condition."""
    records = [
        _rec("s0", "baseline", 1.0, forwards=100, gpu_co_tenants=0),
        _rec("s0", "prefix", 0.5, forwards=50, gpu_co_tenants=0),
        _rec("s1", "baseline", 2.0, forwards=100, gpu_co_tenants=1),
        _rec("s1", "prefix", 1.6, forwards=50, gpu_co_tenants=1),
        _rec("s2", "baseline", 1.0, forwards=100),
        _rec("s2", "prefix", 0.8, forwards=50),  # before the field existed
    ]
    out = tmp_path / "rep"
    md = build_report([_write(tmp_path / "r.jsonl", records)], out).read_text()
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
    assert "shared the GPU" not in build_report([_write(tmp_path / "a.jsonl", alone)], tmp_path / "a").read_text()


def test_a_named_rerun_of_common_samples_is_set_beside_the_unnamed_run(tmp_path: Path):
    """A named run reruns samples that ran on a shared GPU, alone (`--run-name alone-check`): the
    report compares the same samples' speedups, times per forward and tokens across the runs."""
    shared = [
        _rec("s0", "baseline", 2.0, forwards=100, gpu_co_tenants=1, output_hash="b0"),
        _rec("s0", "prefix", 1.0, forwards=50, gpu_co_tenants=1, output_hash="b0"),
        _rec("s1", "baseline", 2.0, forwards=100, gpu_co_tenants=1, output_hash="b1"),
        _rec("s1", "prefix", 1.0, forwards=50, gpu_co_tenants=1, output_hash="b1"),
    ]
    alone_settings = dict(_settings(), run_name="alone-check")
    alone = [
        _rec("s0", "baseline", 1.0, forwards=100, gpu_co_tenants=0, output_hash="b0", settings=alone_settings),
        _rec("s0", "prefix", 0.625, forwards=50, gpu_co_tenants=0, output_hash="other", settings=alone_settings),
    ]
    out = tmp_path / "rep"
    md = build_report([_write(tmp_path / "r.jsonl", shared + alone)], out).read_text()
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
        not in build_report([_write(tmp_path / "l.jsonl", shared + lonely)], tmp_path / "l").read_text()
    )


def test_the_paper_row_table_says_how_many_samples_shared_the_gpu():
    """Shared samples read faster in the speculative modes, so the headline says how many there were."""

    def pair(sample, tenants):
        return [
            _rec(sample, "baseline", 10.0, gpu_co_tenants=tenants),
            _rec(sample, "prefix+suffix", 8.0, gpu_co_tenants=tenants),
        ]

    md, (row,) = ours_beside_theirs(group_records(pair("s0", 1) + pair("s1", 0) + pair("s2", None)))
    assert row["gpu_sharing"] == {"alone": 1, "shared": 1, "not recorded": 1}
    assert "| 1 / 3 (1 not recorded) |" in "\n".join(md) and "| shared GPU |" in md[4]
    md, _ = ours_beside_theirs(group_records(pair("s0", None)))
    assert "| not recorded |" in "\n".join(md)
    md, _ = ours_beside_theirs(group_records(pair("s0", 0) + pair("s1", 0)))
    assert "| 0 / 2 |" in "\n".join(md)


def test_reuse_ablation_pairs_each_run_with_its_own_baseline_beside_the_papers_row(tmp_path: Path):
    """ClassEval: full SSR in the main run, prefix and suffix in a named ablation run with its own baseline.
    Each row's speedups use that run's baseline; loop samples leave the second column; the paper's row
    is there, labelled as theirs; a benchmark other than ClassEval gets no ablation row."""
    named = {**_settings(), "run_name": "ablation"}
    path = _write(
        tmp_path / "runs.jsonl",
        [
            _rec("c0", "baseline", 10.0, benchmark="classeval"),
            _rec("c0", "prefix+suffix", 5.0, benchmark="classeval"),
            _rec("c1", "baseline", 12.0, benchmark="classeval", loop=True),
            _rec("c1", "prefix+suffix", 4.0, benchmark="classeval"),
            _rec("c0", "baseline", 20.0, benchmark="classeval", settings=named),
            _rec("c0", "prefix", 16.0, benchmark="classeval", settings=named),
            _rec("c0", "suffix", 10.0, benchmark="classeval", settings=named),
            _rec("h0", "baseline", 10.0),
            _rec("h0", "prefix", 5.0),  # HumanEval: not the paper's ablation row
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


def test_a_budget_sweeps_tables_come_in_budget_order(tmp_path):
    """Budgets sort as numbers (50 before 100 before 600), not as the text of their settings."""
    path = _write(
        tmp_path / "sweep.jsonl",
        [
            r
            for budget in (600, 100, 50)
            for r in (_rec("s0", "baseline", 2.0, budget=budget), _rec("s0", "prefix", 1.0, budget=budget))
        ],
    )
    groups = group_records(load_records([path]))
    assert [g.settings["draft_budget"] for g in groups] == [50, 100, 600]
