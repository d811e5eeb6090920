"""`selfspec cospec complementarity`: the target and its draft each alone, batched, scored per item."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from selfspec import SamplingParams
from selfspec.cli.main import app
from selfspec.server.cli import load_llm
from selfspec_research.cospec.complementarity import (
    DRAFT,
    TARGET,
    ComplementarityConfig,
    report_markdown,
    run_complementarity,
)
from selfspec_research.cospec.eval_runs import draft_as_llm, token_hash
from selfspec_research.cospec.eval_tasks import answer_text, build_task


def test_rows_count_each_models_own_verdicts_and_batching_keeps_fp32_outputs():
    """Each item's verdict is its checker's on that model's own greedy answer; the batched
    outputs equal one-at-a-time greedy decoding in fp32 (so the rates are the models' own)."""
    llm = load_llm("tiny", num_slots=4, max_len=1024, draft="layers:1")
    config = ComplementarityConfig(tasks=("arithmetic_search", "route_finding"), n=3, max_tokens=40, draft_slots=3)
    result = run_complementarity(llm, config)
    records = result["records"]
    assert [r["label"] for r in records] == [TARGET] * 3 + [DRAFT] * 3 + [TARGET] * 3 + [DRAFT] * 3
    draft = draft_as_llm(llm)
    params = SamplingParams(max_tokens=40)
    for name in config.tasks:
        task = build_task(name, 3, config.seed)
        for item in task.items:
            for label, model in ((TARGET, llm), (DRAFT, draft)):
                (alone,) = model.generate([item.messages], params, thinking=task.thinking)
                (record,) = [r for r in records if r["uid"] == item.uid and r["label"] == label]
                assert record["output_hash"] == token_hash(alone.token_ids)
                answer = answer_text(model, alone.token_ids, True)
                ((passed, score),) = task.score([item.reference], [answer])
                assert (record["passed"], record["score"]) == (bool(passed), round(float(score), 4))
    target_outputs = {r["uid"]: r["output_hash"] for r in records if r["label"] == TARGET}
    draft_outputs = {r["uid"]: r["output_hash"] for r in records if r["label"] == DRAFT}
    assert target_outputs != draft_outputs, "the draft alone is another model"
    rows = result["rows"]
    assert [row["task"] for row in rows] == list(config.tasks)
    for row in rows:
        mine = [r for r in records if r["task"] == row["task"]]
        t = {r["uid"]: r["passed"] for r in mine if r["label"] == TARGET}
        d = {r["uid"]: r["passed"] for r in mine if r["label"] == DRAFT}
        assert row["items"] == 3
        assert row["union"] == sum(t[u] or d[u] for u in t)
        assert row["draft_not_target"] == sum(d[u] and not t[u] for u in t)
    report = report_markdown(result, {"model": "tiny", "draft": "layers:1"})
    assert "| all | 6 |" in report and "room (union - target)" in report


def test_cli_writes_results_and_refuses_the_training_seed(tmp_path):
    out = tmp_path / "c"
    args = ["cospec", "complementarity", "--model", "tiny", "--draft", "layers:1", "--tasks", "arithmetic_search"]
    args += ["--n", "2", "--max-tokens", "24", "--num-slots", "2", "--max-len", "1024", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "results.json").read_text())
    assert saved["meta"]["draft"] == "layers:1" and "torch" in saved["meta"]["versions"]
    assert len(saved["records"]) == 4 and len(saved["rows"]) == 1
    assert "selfspec cospec complementarity --model tiny" in (out / "report.md").read_text()
    bad = CliRunner().invoke(app, [*args[:-2], "--seed", "0", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "training stream" in bad.output
