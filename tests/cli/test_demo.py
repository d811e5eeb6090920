"""`selfspec demo`: the default prompt comes from the demo model's own held-out items, and the
demo runs baseline and SSR side by side with identical output (tiny model)."""

from __future__ import annotations

import io

from rich.console import Console

from selfspec.cli.demo import DEMO_MODEL, run_demo
from selfspec.testing.tiny import save_tiny_model_dir


def test_demo_runs_baseline_and_ssr_with_identical_output(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "m", "llama")
    out = io.StringIO()
    run_demo(
        model=str(model_dir),
        prompt="Write a class.",
        console=Console(file=out, width=120),
        cot_cap=16,
        answer_cap=12,
        draft_budget=6,
    )
    text = " ".join(out.getvalue().split())
    assert "identical output: yes" in text and "latency ratio SSR/baseline" in text
    assert "auto (the default): identical output: yes" in text and "latency ratio auto/baseline" in text
    assert "draft gate:" in text and "first answer token" in text
    assert "reproduce: selfspec bench --benchmark thinker/class_synthesis" in text


def test_shipped_h200_reference_matches_the_committed_records():
    """The figures the demo prints for the H200 are the committed records' own (no drift)."""
    import importlib.util
    from pathlib import Path

    from selfspec.cli.demo import demo_reference

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "thinker" / "demo_reference.py"
    spec = importlib.util.spec_from_file_location("demo_reference", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert demo_reference() == module.summarise()


def test_cli_default_model_is_the_demo_model():
    import inspect

    from selfspec.cli.main import demo

    assert inspect.signature(demo).parameters["model"].default.default == DEMO_MODEL


def test_cli_wrong_model_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from selfspec.cli.main import app

    result = CliRunner().invoke(app, ["demo", "--model", str(tmp_path / "no-model")])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "does not exist" in " ".join(result.output.split()) and "Traceback" not in result.output
