"""`benchmarks/draft_batching.py` runs end to end on the tiny model and finds identical outputs."""

from __future__ import annotations

import json

from typer.testing import CliRunner


def test_draft_batching_benchmark_on_the_tiny_model(tmp_path, repo_script):
    module = repo_script("benchmarks/draft_batching.py")
    out = tmp_path / "db"
    result = CliRunner().invoke(
        module.app,
        [
            "--model",
            "tiny",
            "--draft",
            "layers:1",
            "--prompts",
            "3",
            "--max-tokens",
            "12",
            "--k",
            "4",
            "--repeats",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())
    assert summary["same_outputs"] is True
    runs = summary["runs"]
    assert runs["batched"][0]["draft_forwards"] < runs["per-sequence"][0]["draft_forwards"]
    assert "faster end to end" in (out / "report.md").read_text()
    from selfspec.thinking.policy import ThinkingPolicy

    assert ThinkingPolicy.proposal_group is not None and "lambda" not in ThinkingPolicy.proposal_group.__qualname__
