"""`selfspec cospec eval` on a tiny random model: files, LOSSY marking, λ = 1 exactness, CLI."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from selfspec import CoSpecConfig, DraftModelConfig, SamplingParams
from selfspec.cli.main import app
from selfspec.server.cli import load_llm
from selfspec.spec.cospec import Arbitrator
from selfspec.spec.cospec.checkpoint import load_arbitrator_for, save_arbitrator
from selfspec_research.cospec import counterfactual, evaluate
from selfspec_research.cospec.cli import parse_thresholds
from selfspec_research.cospec.eval_config import CoSpecEvalConfig
from selfspec_research.cospec.eval_report import write_outputs
from selfspec_research.cospec.eval_runs import run_item
from selfspec_research.cospec.eval_tasks import build_task, parse_tasks
from selfspec_research.cospec.evaluate import run_cospec_eval
from selfspec_research.thinker.data_versions import data_version_knobs
from selfspec_research.thinker.tasks import generate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny arbitrator (adapters and head moved off their init) saved as a checkpoint."""
    llm = load_llm("tiny", num_slots=2, max_len=2048, draft="layers:1")
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=1)
    with torch.no_grad():
        for name, param in arbitrator.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    return save_arbitrator(arbitrator, tmp_path_factory.mktemp("ckpt") / "arb", draft="layers:1", target="tiny")


@pytest.fixture(scope="module")
def llm():
    return load_llm("tiny", num_slots=4, max_len=2048, draft="layers:1")


@pytest.fixture(scope="module")
def arbitrator(llm, checkpoint):
    return load_arbitrator_for(llm, checkpoint)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_pipeline_writes_files_and_marks_cospec_lossy(llm, arbitrator, tmp_path):
    config = CoSpecEvalConfig(
        tasks=("arithmetic_search",),
        n=2,
        thresholds=(0.0, 1.0),
        k=4,
        max_tokens=24,
        counterfactual_states=2,
        warmup=False,
    )
    results = run_cospec_eval(llm, config, arbitrator, progress=False)
    paths = write_outputs(results, tmp_path / "out")
    assert [p.name for p in paths] == ["results.jsonl", "report.md", "speed_score.png"]
    assert (tmp_path / "out" / "speed_score.png").read_bytes()[:8] == PNG_MAGIC
    lines = _lines(tmp_path / "out" / "results.jsonl")
    assert lines[0]["kind"] == "config" and lines[0]["config"]["thresholds"] == [0.0, 1.0]
    items = [r for r in lines if r["kind"] == "item"]
    summaries = [r for r in lines if r["kind"] == "summary"]
    assert len(items) == 2 * 5
    assert [s["label"] for s in summaries] == ["target", "sps", "draft-alone", "cospec@0", "cospec@1"]
    for row in items + summaries:
        assert row["lossy"] is (row["mode"] in ("cospec", "draft")), row
    # The draft alone is another model: its outputs are not the target's.
    (complement,) = [r for r in lines if r["kind"] == "complementarity"]
    by_item = {(r["uid"], r["label"]): r["passed"] for r in items}
    uids = sorted({r["uid"] for r in items})
    assert complement["items"] == 2
    assert complement["target_solved"] == sum(by_item[(u, "target")] for u in uids)
    assert complement["draft_solved"] == sum(by_item[(u, "draft-alone")] for u in uids)
    assert complement["union"] == sum(by_item[(u, "target")] or by_item[(u, "draft-alone")] for u in uids)
    assert set(complement["cospec"]) == {"cospec@0", "cospec@1"}
    assert complement["cospec"]["cospec@1"]["beyond_target"] == 0 == complement["cospec"]["cospec@1"]["lost_vs_target"]
    assert all(r["lossy"] is True for r in lines if r["kind"].startswith("counterfactual"))
    by_label = {s["label"]: s for s in summaries}
    # SpS and λ = 1 are exact; λ = 0 keeps draft tokens at mismatches and changes the output.
    assert by_label["sps"]["same_as_target"] == 1.0 and by_label["sps"]["kept_draft_tokens"] == 0
    assert by_label["cospec@1"]["same_as_target"] == 1.0 and by_label["cospec@1"]["kept_draft_tokens"] == 0
    assert by_label["cospec@0"]["kept_draft_tokens"] > 0 and by_label["cospec@0"]["same_as_target"] < 1.0
    assert by_label["target"]["tau"] == 1.0 and by_label["cospec@0"]["tau"] > by_label["sps"]["tau"]
    assert all(s["speedup"] is not None and s["accuracy"] is not None for s in summaries)
    states = [r for r in lines if r["kind"] == "counterfactual"]
    assert 1 <= len(states) <= 2
    for state in states:
        assert state["choice"] == {"0": "draft", "1": "target"}  # λ = 0 always keeps, λ = 1 never
        assert set(state["agrees"]) == {"0", "1"} and 0.0 <= state["keep_probability"] <= 1.0
    agreement = [r for r in lines if r["kind"] == "counterfactual_summary"]
    assert [r["threshold"] for r in agreement] == [0.0, 1.0] and agreement[0]["states"] == len(states)
    report = (tmp_path / "out" / "report.md").read_text()
    cospec_rows = [line for line in report.splitlines() if line.startswith("| CoSpec")]
    assert len(cospec_rows) == 2 and all("LOSSY" in line for line in cospec_rows)
    assert "| SpS (lossless) | no |" in report and "speed_score.png" in report
    assert "| draft model alone (not the target) | yes |" in report and "Complementarity over 2 items" in report
    assert "- versions: python " in report and "torch " in report  # GPU results must say what ran them


def test_threshold_one_is_lossless_and_zero_keeps_draft_tokens(llm, arbitrator):
    prompts = ["What is 12 + 30?", "Write a counter class", "Route from A to B"]
    params = SamplingParams(max_tokens=32)
    target = llm.generate(prompts, params)
    sps = llm.generate(prompts, params, spec=DraftModelConfig(num_speculative_tokens=4))
    never = llm.generate(
        prompts, params, spec=CoSpecConfig(num_speculative_tokens=4, threshold=1.0, arbitrator=arbitrator)
    )
    always = llm.generate(
        prompts, params, spec=CoSpecConfig(num_speculative_tokens=4, threshold=0.0, arbitrator=arbitrator)
    )
    for t, s, n in zip(target, sps, never):
        assert t.token_ids == s.token_ids == n.token_ids
        assert n.metrics["lossy"] is True and n.metrics["kept_draft_tokens"] == 0
    assert sum(n.metrics["arbitrations"] for n in never) > 0, "no mismatch was arbitrated"
    assert sum(a.metrics["kept_draft_tokens"] for a in always) > 0
    assert any(a.token_ids != t.token_ids for a, t in zip(always, target))


def test_eval_refuses_training_seeds_and_bad_options(llm, arbitrator):
    with pytest.raises(ValueError, match="training stream"):
        run_cospec_eval(llm, CoSpecEvalConfig(tasks=("route_finding",), n=1, seed=0), arbitrator, progress=False)
    arbitrator.identity = {**arbitrator.identity, "training": {"data_seeds": [1234]}}
    try:
        with pytest.raises(ValueError, match="data_seeds"):
            run_cospec_eval(llm, CoSpecEvalConfig(tasks=("route_finding",), n=1, seed=1234), arbitrator, progress=False)
    finally:
        arbitrator.identity = {**arbitrator.identity, "training": {}}
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        parse_thresholds("0.5,1.5")
    with pytest.raises(ValueError, match="unknown tasks"):
        parse_tasks("gsm8k,nope")
    with pytest.raises(ValueError, match="thresholds"):
        CoSpecEvalConfig(thresholds=(-0.1,))


def test_cli_eval_end_to_end(checkpoint, tmp_path):
    out = tmp_path / "cli"
    args = [
        "cospec",
        "eval",
        "--model",
        "tiny",
        "--arbitrator",
        str(checkpoint),
        "--tasks",
        "gsm8k",
        "--n",
        "2",
        "--thresholds",
        "0,1",
        "--k",
        "4",
        "--max-tokens",
        "16",
        "--counterfactual-states",
        "1",
        "--max-len",
        "2048",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
        "--no-warmup",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = _lines(out / "results.jsonl")
    assert lines[0]["draft"] == "layers:1", "the draft comes from the checkpoint"
    assert lines[0]["arbitrator_config"]["target"] == "tiny"
    assert {r["label"] for r in lines if r["kind"] == "summary"} == {
        "target",
        "sps",
        "draft-alone",
        "cospec@0",
        "cospec@1",
    }
    assert all(r["lossy"] for r in lines if r.get("mode") == "cospec")
    assert (out / "report.md").exists() and (out / "speed_score.png").read_bytes()[:8] == PNG_MAGIC
    assert "selfspec cospec eval --model tiny" in (out / "report.md").read_text()


def test_cli_eval_without_arbitrator_measures_target_and_sps_only(tmp_path):
    out = tmp_path / "plain"
    args = [
        "cospec",
        "eval",
        "--model",
        "tiny",
        "--draft",
        "layers:1",
        "--tasks",
        "gsm8k,humaneval",
        "--n",
        "1",
        "--k",
        "4",
        "--sps-k",
        "2,4",
        "--max-tokens",
        "8",
        "--max-len",
        "2048",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
        "--no-warmup",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = _lines(out / "results.jsonl")
    summaries = [r for r in lines if r["kind"] == "summary"]
    assert [r["label"] for r in summaries] == ["target", "sps", "sps@k2", "draft-alone"] * 2  # K 4 is --k's row
    assert all(r["same_as_target"] == 1.0 for r in summaries if r["mode"] == "sps")  # lossless at every K
    assert [r["k"] for r in summaries if r["mode"] == "sps"] == [None, 2] * 2
    assert [r["task"] for r in lines if r["kind"] == "complementarity"] == ["gsm8k", "humaneval"]
    assert not [r for r in lines if r["kind"].startswith("counterfactual")]
    bad = CliRunner().invoke(app, ["cospec", "eval", "--model", "tiny", "--thresholds", "2", "--out", str(out)])
    assert bad.exit_code == 2 and "thresholds" in bad.output
    bad = CliRunner().invoke(app, ["cospec", "eval", "--model", "tiny", "--sps-k", "0", "--out", str(out)])
    assert bad.exit_code == 2 and "--sps-k" in bad.output


def test_thinker_tasks_take_a_data_version_for_harder_items():
    default = build_task("route_finding", 2, 1000)
    hard = build_task("route_finding", 2, 1000, data_version="thinker-data-hard-v1")
    knobs = data_version_knobs("thinker-data-hard-v1")["route_finding"]
    assert [item.reference for item in hard.items] == [generate("route_finding", 1000, i, **knobs) for i in (0, 1)]
    assert default.items[0].reference.meta["knobs"] != hard.items[0].reference.meta["knobs"]
    assert build_task("gsm8k", 1, 1000, data_version="thinker-data-hard-v1").items  # ignored off the thinker families
    assert CoSpecEvalConfig(tasks=("route_finding",), data_version="thinker-data-hard-v2").describe()["data_version"]
    with pytest.raises(ValueError, match="unknown data version"):
        CoSpecEvalConfig(tasks=("route_finding",), data_version="thinker-data-nope")


def test_humaneval_task_scores_with_the_tests():
    """HumanEval items are picked by seed and scored by running the problem's check()."""
    task = build_task("humaneval", 2, 1000)
    again = build_task("humaneval", 2, 1000)
    assert [i.uid for i in task.items] == [i.uid for i in again.items]
    refs = [item.reference for item in task.items]
    solutions = [f"```python\n{r.reference['prompt']}{r.reference['canonical_solution']}\n```" for r in refs]
    assert [passed for passed, _ in task.score(refs, solutions)] == [True, True]
    assert [passed for passed, _ in task.score(refs, ["```python\nreturn None\n```"] * 2)] == [False, False]


def test_cli_report_merges_runs_split_by_task(tmp_path):
    """Tasks evaluated in two runs (two GPUs) become one report; mismatched runs are refused."""
    common = [
        "--model",
        "tiny",
        "--draft",
        "layers:1",
        "--no-draft-alone",
        "--n",
        "1",
        "--k",
        "4",
        "--max-tokens",
        "8",
        "--max-len",
        "2048",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--no-progress",
        "--no-warmup",
    ]
    for name, task in (("a", "gsm8k"), ("b", "humaneval")):
        result = CliRunner().invoke(app, ["cospec", "eval", "--tasks", task, "--out", str(tmp_path / name), *common])
        assert result.exit_code == 0, result.output
    merged = tmp_path / "merged"
    result = CliRunner().invoke(
        app,
        [
            "cospec",
            "report",
            str(tmp_path / "a" / "results.jsonl"),
            str(tmp_path / "b" / "results.jsonl"),
            "--out",
            str(merged),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = _lines(merged / "results.jsonl")
    assert lines[0]["config"]["tasks"] == ["gsm8k", "humaneval"]
    assert [(r["task"], r["label"]) for r in lines if r["kind"] == "summary"] == [
        ("gsm8k", "target"),
        ("gsm8k", "sps"),
        ("humaneval", "target"),
        ("humaneval", "sps"),
    ]
    text = (merged / "report.md").read_text()
    assert "## gsm8k" in text and "## humaneval" in text and (merged / "speed_score.png").exists()
    other = tmp_path / "c"
    result = CliRunner().invoke(
        app,
        [
            "cospec",
            "eval",
            "--tasks",
            "gsm8k",
            "--out",
            str(other),
            *common[:-4],
            "--k",
            "2",
            "--no-progress",
            "--no-warmup",
        ],
    )
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(
        app,
        [
            "cospec",
            "report",
            str(tmp_path / "a" / "results.jsonl"),
            str(other / "results.jsonl"),
            "--out",
            str(tmp_path / "bad"),
        ],
    )
    assert bad.exit_code != 0 and "differs" in bad.output


def test_interrupted_eval_resumes_from_its_journal(llm, arbitrator, tmp_path, monkeypatch):
    """A run killed mid-task keeps its finished runs; the re-run skips them and gives the same rows."""
    config = CoSpecEvalConfig(
        tasks=("arithmetic_search", "class_synthesis"),
        n=2,
        thresholds=(0.0,),
        k=4,
        max_tokens=16,
        counterfactual_states=1,
        warmup=False,
    )
    journal = tmp_path / "partial.jsonl"
    full = run_cospec_eval(llm, config, arbitrator, progress=False)

    real_run, calls = run_item, []

    def every_run_through(fn) -> None:  # the timed runs and the counterfactual probes
        for module in (evaluate, counterfactual):
            monkeypatch.setattr(module, "run_item", fn)

    def dying_run(*args, **kwargs):
        if len(calls) == 9:  # the first task's 8 timed runs are journalled, one counterfactual probe ran
            raise KeyboardInterrupt
        calls.append(args[3].label)
        return real_run(*args, **kwargs)

    every_run_through(dying_run)
    with pytest.raises(KeyboardInterrupt):
        run_cospec_eval(llm, config, arbitrator, progress=False, journal_path=journal)
    kinds = [line["kind"] for line in _lines(journal)]
    with journal.open("a") as handle:
        handle.write('{"kind": "run", "task": "arith')  # a line cut by the kill
    assert kinds[0] == "journal" and kinds.count("task_done") == 0  # killed during the counterfactual probe
    assert kinds.count("run") == 8  # 2 items x 4 modes (target, SpS, draft alone, λ 0) of the first task
    counted = []
    every_run_through(lambda *a, **k: counted.append(a[3].label) or real_run(*a, **k))
    resumed = run_cospec_eval(llm, config, arbitrator, progress=False, journal_path=journal)
    # Only the probes and the second task ran again; the first task's timed runs came from disk.
    assert counted.count("target") == 2 and counted.count("draft-alone") == 2 and len(counted) == 2 + 8 + 2

    def strip(rows):
        return [{k: v for k, v in r.items() if k not in ("latency_s", "arbitration_s")} for r in rows]

    assert [r["token_ids_hash"] for r in resumed.items] == [r["token_ids_hash"] for r in full.items]
    assert [(r["passed"], r["score"]) for r in resumed.items] == [(r["passed"], r["score"]) for r in full.items]
    assert len(strip(resumed.summaries)) == len(full.summaries)
    assert resumed.complementarity == full.complementarity and len(full.complementarity) == 2
    assert journal.read_text().splitlines().count('{"kind": "run", "task": "arith') == 1  # closed, not merged
    again = run_cospec_eval(llm, config, arbitrator, progress=False, journal_path=journal)
    assert [r["token_ids_hash"] for r in again.items] == [r["token_ids_hash"] for r in full.items]
    with pytest.raises(ValueError, match="another config"):
        run_cospec_eval(
            llm,
            CoSpecEvalConfig(tasks=("arithmetic_search",), n=1, warmup=False),
            arbitrator,
            progress=False,
            journal_path=journal,
        )
    retrained = copy.deepcopy(arbitrator)  # same config, other weights (e.g. after more RL)
    with torch.no_grad():
        retrained.head.bias.add_(0.1)
    with pytest.raises(ValueError, match="arbitrator"):
        run_cospec_eval(llm, config, retrained, progress=False, journal_path=journal)
