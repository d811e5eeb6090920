"""`selfspec bench` end to end on a tiny model: 2 HumanEval samples x 7 modes, then the report.

This is the CI run of the real command line: dataset loading, every mode through the
engine (and transformers `generate`), JSONL records, exactness against the baseline, and
`bench report` reading what `bench` wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.testing.tiny import save_tiny_model_dir

MODES = [
    "baseline",
    "prefix",
    "prefix+suffix",
    "ssr+think-gated",
    "ssr+lookup",
    "iterative",
    "iterative-converge",
    "suffix-decoding",
    "prompt-lookup",
    "suffix+lookup",
    "hf-generate",
]
LIMITS = ["--cot-cap", "24", "--draft-budget", "8", "--max-draft", "16", "--answer-cap", "16"]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """Run the benchmark once for the module: (records, jsonl path, work dir)."""
    root = tmp_path_factory.mktemp("bench_cli")
    model_dir = save_tiny_model_dir(root / "m", "qwen3")
    out = root / "r.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "2",
            "--model",
            str(model_dir),
            "--modes",
            ",".join(MODES),
            *LIMITS,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return records, out, root


def test_bench_writes_one_exact_record_per_sample_and_mode(bench_run):
    records, _, _ = bench_run
    assert len(records) == 2 * len(MODES)
    assert {(r["sample_id"], r["mode"]) for r in records} == {
        (s, m) for s in ("HumanEval/0", "HumanEval/1") for m in MODES
    }
    assert all(r["exact_match"] is True for r in records), [
        (r["sample_id"], r["mode"]) for r in records if not r["exact_match"]
    ]
    for r in records:
        assert r["benchmark"] == "humaneval" and r["settings"]["draft_budget"] == 8 and r["latency_s"] > 0
        assert r["cot_tokens"] == 24 and r["answer_tokens"] == 16  # the fixed-length shape held in every mode
        # What the tokenizer made of the prompt, the same in every mode of a sample; and where it came from.
        assert r["prompt_tokens"] == next(x["prompt_tokens"] for x in records if x["sample_id"] == r["sample_id"]) > 20
        assert r["tokenizer"] == "model" and r["tokenizer_summary"]["vocab"] > 100
        assert "_token_ids" not in r and "_token_shapes" not in r  # in-memory lists are not written
        # Where the model itself ended its forced answer (every mode, hf-generate included), and nothing
        # after a token past the answer's length.
        assert "answer_eos_at" in r and 0 <= r["forced_past_eos"] < r["answer_tokens"]
        assert (r["forced_past_eos"] > 0) == ("answer_text_at_eos" in r)
        if r["mode"] != "hf-generate":  # output tokens per forward shape (the engine's modes)
            assert sum(r["forward_shapes"].values()) == r["output_tokens"] and r["forward_shapes"].get("forced", 0) >= 1
            assert r["compiled_graphs"] == 0  # nothing compiled inside a timed run (the CPU engine compiles nothing)
        if r["mode"] == "baseline":
            assert "first_divergence" not in r
        else:  # compared with the baseline run just before in the same process: never left it
            assert r["first_divergence"] is None and r["first_divergence_phase"] is None


def test_bench_report_has_a_row_per_mode(bench_run):
    _, out, root = bench_run
    rep = root / "rep"
    result = CliRunner().invoke(app, ["bench", "report", str(out), "--out-dir", str(rep)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = (rep / "report.md").read_text()
    for mode in MODES:
        assert f"\n| {mode} | 2 | " in text
    assert (rep / "summary.json").exists()
    assert sorted(p.name.split("_")[0] for p in rep.glob("*.png")) == ["budget", "latency"]


def test_bench_help():
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert result.exit_code == 0
    assert "--draft-budget" in result.output and "report" in result.output


def test_unknown_mode_exits_with_code_2(tmp_path: Path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(app, ["bench", "--modes", "baseline,warp-drive", "--out", str(out), "--limit", "1"])
    assert result.exit_code == 2
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-b", "nosuch"], "unknown benchmark"),
        (["-b", "humaneval", "--path", "{tmp}/missing.jsonl"], "not found"),
        (["-b", "classeval", "--path", "{tmp}/not_json.json"], "benchmark classeval"),
        (["-b", "humaneval", "--offset", "100000", "--limit", "2"], "selects no sample"),
        (["--limit", "0"], "--limit"),
        (["--offset", "-1"], "--offset"),
        (["--max-draft", "0"], "--max-draft"),
        (["--cot-cap", "-5"], "--cot-cap"),
        (["--suffix-depth", "1"], "--suffix-depth"),
        (["--suffix-factor", "-1"], "--suffix-factor"),
        (["--draft-budget", "4,8", "--suffix-spec-tokens", "0"], "--suffix-spec-tokens"),
    ],
)
def test_bad_input_is_a_clear_error_before_the_model_loads(tmp_path: Path, args: list[str], says: str):
    """Each is exit 2 with a line naming what is wrong, no traceback, and no record written. The model
    path does not exist: an error about it would mean the command got as far as loading the model
    (before these checks, a bad --max-draft failed only after the first sample's baseline had run)."""
    (tmp_path / "not_json.json").write_text("this is not JSON")
    out = tmp_path / "r.jsonl"
    argv = ["bench", *[a.format(tmp=tmp_path) for a in args], "--model", str(tmp_path / "no-model"), "--out", str(out)]
    result = CliRunner().invoke(app, argv)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, (argv, text, result.exception)
    assert says in text and "no-model" not in text and "Traceback" not in text, text
    assert not out.exists()


def test_concurrency_batches_samples_and_keeps_tokens(bench_run, tmp_path: Path):
    """--concurrency 2: both samples' requests of each mode share a batch; tokens are those of
    the one-at-a-time run, and the records are kept apart from it (concurrency is a setting)."""
    records, _, root = bench_run
    out = tmp_path / "c.jsonl"
    modes = ["baseline", "prefix+suffix", "suffix-decoding"]
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "2",
            "--model",
            str(root / "m"),
            "--modes",
            ",".join(modes),
            *LIMITS,
            "--concurrency",
            "2",
            "--record-schedule",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    batched = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(batched) == 2 * len(modes) and all(r["settings"]["concurrency"] == 2 for r in batched)
    # One schedule per batch, on one of its records: both requests' rows in its forwards.
    for mode in modes:
        carriers = [r for r in batched if r["mode"] == mode and "batch_schedule" in r]
        assert len(carriers) == 1 and all("schedule" not in r for r in batched if r["mode"] == mode)
        schedule = carriers[0]["batch_schedule"]
        assert schedule["forwards"] > 0 and schedule["gpu_s"] > 0
    assert all(r["exact_match"] is True for r in batched)
    single = {(r["sample_id"], r["mode"]): r["output_hash"] for r in records}
    for r in batched:
        assert r["output_hash"] == single[(r["sample_id"], r["mode"])]
        assert r["latency_s"] > 0
    # The report pairs the two runs: per-mode speedups one at a time vs batched.
    _, single_path, _ = bench_run
    rep = tmp_path / "rep"
    result = CliRunner().invoke(app, ["bench", "report", str(single_path), str(out), "--out-dir", str(rep)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = (rep / "report.md").read_text()
    assert "## Concurrency check" in text and "concurrency 1 vs 2, 2 common samples" in text
    assert "| prefix+suffix | " in text.split("## Concurrency check")[1]
    # Each record names its batch and the batch's wall time; the run's section gives the throughput.
    for mode in modes:
        recs = [r for r in batched if r["mode"] == mode]
        assert {r["batch"] for r in recs} == {0} and len({r["batch_wall_s"] for r in recs}) == 1
        assert recs[0]["batch_wall_s"] >= max(r["latency_s"] for r in recs) * 0.999
    assert "### Throughput under load" in text and "| suffix-decoding | 2 | 1 |" in text


def test_samples_that_cannot_fit_the_context_are_skipped_and_reported(bench_run, tmp_path: Path):
    """Prompt + CoT cap + answer cap beyond the model's context (4096 for the tiny model): the
    sample is recorded as skipped, once, the run does not abort, and the report names it."""
    _, _, root = bench_run
    out = tmp_path / "s.jsonl"
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "2",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline",
        "--cot-cap",
        "24",
        "--draft-budget",
        "8",
        "--max-draft",
        "16",
        "--answer-cap",
        "4080",
        "--out",
        str(out),
    ]
    for extra in ([], [], ["--fresh"]):  # a rerun neither repeats the skip records nor fails; --fresh keeps them
        result = CliRunner().invoke(app, args + extra)
        assert result.exit_code == 0, result.output + repr(result.exception)
        assert "2 of 2 samples skipped" in " ".join(result.output.split())
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [(r["sample_id"], r["mode"]) for r in records] == [("HumanEval/0", "skipped"), ("HumanEval/1", "skipped")]
    assert all(r["context"] == 4096 and r["needed_tokens"] > 4096 and r["prompt_tokens"] > 0 for r in records)
    rep = tmp_path / "rep"
    result = CliRunner().invoke(app, ["bench", "report", str(out), "--out-dir", str(rep)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = (rep / "report.md").read_text()
    assert "no sample fits" in text and "**Skipped: 2 samples**" in text and "HumanEval/1" in text


def test_max_len_fixes_the_engine_size_and_rejects_too_short(bench_run, tmp_path: Path):
    _, _, root = bench_run
    out = tmp_path / "m.jsonl"
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "1",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline",
        *LIMITS,
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args + ["--max-len", "1000"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["engine_max_len"] == 1000
    result = CliRunner().invoke(app, args + ["--max-len", "20", "--fresh"])
    assert result.exit_code == 2 and "shorter than" in " ".join(result.output.split())
    result = CliRunner().invoke(app, args + ["--max-len", "100000", "--fresh"])
    assert result.exit_code == 2 and "exceeds" in " ".join(result.output.split())


def test_token_buckets_are_recorded_and_validated(bench_run, tmp_path):
    records, _, root = bench_run
    assert all(r["token_buckets"] == [1, 2, 4, 8, 16, 32, 64] for r in records)  # the default, recorded
    model_dir = root / "m"
    out = tmp_path / "b.jsonl"
    ok = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--limit",
            "1",
            "--model",
            str(model_dir),
            "--modes",
            "baseline",
            *LIMITS,
            "--token-buckets",
            "1,2,4,16,64",
            "--out",
            str(out),
        ],
    )
    assert ok.exit_code == 0, ok.output
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["token_buckets"] == [1, 2, 4, 16, 64]
    for bad in ("4,2", "0,4", "x"):
        result = CliRunner().invoke(
            app, ["bench", "--model", str(model_dir), "--token-buckets", bad, "--out", str(out)]
        )
        assert result.exit_code == 2 and "--token-buckets" in result.output, (bad, result.output)


def test_ids_select_samples_and_unknown_ids_are_a_clear_error(bench_run, tmp_path):
    _, _, root = bench_run
    out = tmp_path / "ids.jsonl"
    ok = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--ids",
            "HumanEval/3,HumanEval/1",
            "--model",
            str(root / "m"),
            "--modes",
            "baseline",
            *LIMITS,
            "--out",
            str(out),
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert [json.loads(line)["sample_id"] for line in out.read_text().splitlines()] == ["HumanEval/1", "HumanEval/3"]
    bad = CliRunner().invoke(
        app,
        [
            "bench",
            "-b",
            "humaneval",
            "--ids",
            "HumanEval/1,HumanEval/999",
            "--model",
            str(root / "m"),
            "--out",
            str(out),
        ],
    )
    assert bad.exit_code == 2 and "HumanEval/999" in bad.output


def test_a_named_run_does_not_resume_from_an_unnamed_one(bench_run, tmp_path):
    """`--run-name`: a second run of the same settings into the same file (an ablation that needs its
    own baseline) runs its samples instead of skipping them as done, and its records say its name."""
    _, out, root = bench_run
    shared = tmp_path / "shared.jsonl"
    shared.write_text(out.read_text())
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "1",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline",
        *LIMITS,
        "--out",
        str(shared),
    ]
    for extra in (["--run-name", "ablation"], ["--run-name", "ablation"], []):  # rerun: resumes; unnamed: all done
        result = CliRunner().invoke(app, args + extra)
        assert result.exit_code == 0, result.output
    named = [r for r in map(json.loads, shared.read_text().splitlines()) if r["settings"].get("run_name") == "ablation"]
    assert [(r["sample_id"], r["mode"]) for r in named] == [("HumanEval/0", "baseline")]
    assert "--run-name ablation" in named[0]["command"]
    assert len(shared.read_text().splitlines()) == len(out.read_text().splitlines()) + 1


def test_a_larger_limit_resumes_the_same_file_where_it_stopped(bench_run, tmp_path):
    """A command whose `--limit` grew (a run of samples 0-49 cut off at 28, then the same file asked for
    0-99) reruns nothing that is recorded, adds the new samples, and gives them the place in the mode
    order a single run of the larger limit would have given them."""
    _, _, root = bench_run
    out = tmp_path / "grow.jsonl"
    args = [
        "bench",
        "-b",
        "humaneval",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline,prefix+suffix",
        *LIMITS,
        "--out",
        str(out),
    ]
    first = CliRunner().invoke(app, args + ["--limit", "1"])
    assert first.exit_code == 0, first.output
    before = out.read_text()
    grown = CliRunner().invoke(app, args + ["--limit", "2"])
    assert grown.exit_code == 0, grown.output
    assert out.read_text().startswith(before)  # the recorded sample is neither rerun nor rewritten
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["sample_id"], r["mode"]) for r in records] == [
        ("HumanEval/0", "baseline"),
        ("HumanEval/0", "prefix+suffix"),
        ("HumanEval/1", "baseline"),
        ("HumanEval/1", "prefix+suffix"),
    ]
    places = {(r["sample_id"], r["mode"]): r["run_position"] for r in records}
    # The order rotates by the sample's index in the selection, not by how many were left to run.
    assert places == {
        ("HumanEval/0", "baseline"): 1,
        ("HumanEval/0", "prefix+suffix"): 2,
        ("HumanEval/1", "prefix+suffix"): 1,
        ("HumanEval/1", "baseline"): 2,
    }
    assert all(r["exact_match"] is True for r in records if r["mode"] != "baseline")


def test_a_given_tokenizer_is_used_and_recorded_and_a_wrong_path_is_a_clear_error(bench_run, tmp_path: Path):
    _, _, root = bench_run
    from selfspec.testing.tiny import tiny_tokenizer

    given = tmp_path / "tok"
    tiny_tokenizer().save_pretrained(given)
    out = tmp_path / "t.jsonl"
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "1",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline",
        *LIMITS,
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args + ["--tokenizer", str(given)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["tokenizer"] == str(given.resolve()) and record["prompt_tokens"] > 20
    result = CliRunner().invoke(app, args + ["--tokenizer", str(tmp_path / "nowhere"), "--fresh"])
    assert result.exit_code == 2 and "not a tokenizer directory" in " ".join(result.output.split())


def test_resuming_onto_records_of_another_tokenizer_is_refused(bench_run, tmp_path: Path):
    _, _, root = bench_run
    out = tmp_path / "r.jsonl"
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "2",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline",
        *LIMITS,
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args[:4] + ["1"] + args[5:])  # the first sample only
    assert result.exit_code == 0, result.output + repr(result.exception)
    first = json.loads(out.read_text().splitlines()[0])
    # The same run, but as if its prompts had been tokenized another way (a wrongly built GGUF tokenizer).
    first["tokenizer_summary"] = {**first["tokenizer_summary"], "probe_chars_per_token": 1.0}
    out.write_text(json.dumps(first) + "\n")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "another tokenizer" in " ".join(result.output.split())
    assert len(out.read_text().splitlines()) == 1  # nothing appended
    result = CliRunner().invoke(app, args + ["--fresh"])
    assert result.exit_code == 0 and len(out.read_text().splitlines()) == 2


def test_a_draft_budget_sweep_runs_once_per_budget_and_the_report_plots_each(bench_run, tmp_path: Path):
    """`--draft-budget 6,12`: one run per budget on one engine, each with its own exact baseline and the
    command that reproduces it alone; resuming runs nothing again; the report's budget plot has both."""
    _, _, root = bench_run
    out = tmp_path / "sweep.jsonl"
    limits = ["--cot-cap", "24", "--max-draft", "16", "--answer-cap", "16"]
    args = [
        "bench",
        "-b",
        "humaneval",
        "--limit",
        "1",
        "--model",
        str(root / "m"),
        "--modes",
        "baseline,prefix+suffix",
        *limits,
        "--draft-budget",
        "6,12",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["settings"]["draft_budget"], r["mode"]) for r in records) == [
        (6, "baseline"),
        (6, "prefix+suffix"),
        (12, "baseline"),
        (12, "prefix+suffix"),
    ]
    assert all(r["exact_match"] is True for r in records)
    for r in records:
        assert f"--draft-budget {r['settings']['draft_budget']} " in r["command"]
    # The fork happened at each budget: the draft saw that many CoT tokens, so the runs really differ.
    ssr = {r["settings"]["draft_budget"]: r for r in records if r["mode"] == "prefix+suffix"}
    assert ssr[6]["drafts"] >= 1 and ssr[12]["drafts"] >= 1
    result = CliRunner().invoke(app, args)  # resumed: both budgets are done
    assert result.exit_code == 0 and len(out.read_text().splitlines()) == 4
    rep = tmp_path / "rep"
    result = CliRunner().invoke(app, ["bench", "report", str(out), "--out-dir", str(rep)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads((rep / "summary.json").read_text())
    assert [p["draft_budgets"] for p in summary["budget_plots"]] == [[6, 12]]


@pytest.mark.parametrize("budgets", ["0", "abc", "8,8", ",", "8,-1"])
def test_bad_draft_budgets_are_a_clear_error(budgets: str, tmp_path: Path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        app, ["bench", "--limit", "1", "--model", "nowhere", "--draft-budget", budgets, "--out", str(out)]
    )
    assert result.exit_code == 2 and "--draft-budget" in result.output and not out.exists()
