"""`selfspec bench replay-check` and `check-cost-model`: a projection's agreement with what it
projects, computed from committed files without a device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.engine.cost_model import TERMS, Buckets, StepCostModel
from selfspec_bench.replay_validation import agreement_by_benchmark, cost_model_check, grid_points, speedup_agreement


def _record(sample: str, mode: str, measured: float, projected: float, benchmark: str = "thinker/a") -> dict:
    return {
        "benchmark": benchmark,
        "sample_id": sample,
        "mode": mode,
        "measured_latency_s": measured,
        "latency_s": projected,
        "replay": {"shape": "smollm2"},
    }


def test_speedups_are_paired_per_sample_both_ways():
    records = [
        _record("s1", "baseline", 2.0, 2.2),
        _record("s1", "lookup", 1.0, 1.0),
        _record("s2", "baseline", 4.0, 4.0),
        _record("s2", "lookup", 1.0, 2.0),
        {"sample_id": "s3", "mode": "skipped", "kind": "skipped"},  # not a replayed record: ignored
    ]
    result = speedup_agreement(records)
    lookup = result["modes"]["lookup"]
    assert lookup["measured_speedup"] == pytest.approx((2.0 + 4.0) / 2)
    assert lookup["projected_speedup"] == pytest.approx((2.2 + 2.0) / 2)
    assert lookup["speedup_difference"] == pytest.approx(2.1 - 3.0)
    assert lookup["mean_abs_error"] == pytest.approx(0.5) and lookup["max_abs_error"] == pytest.approx(1.0)
    assert result["modes"]["baseline"]["mean_abs_error"] == pytest.approx(0.05)
    assert "speedup_difference" not in result["modes"]["baseline"]
    assert result["records"] == 4 and result["max_speedup_difference"] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="no replayed records"):
        speedup_agreement([{"sample_id": "x", "mode": "baseline", "latency_s": 1.0}])


def test_each_benchmark_is_checked_apart():
    records = [
        _record("s1", "baseline", 2.0, 2.0),
        _record("s1", "lookup", 1.0, 1.0),
        _record("s1", "baseline", 3.0, 3.0, benchmark="thinker/b"),
        _record("s1", "lookup", 1.0, 1.5, benchmark="thinker/b"),
    ]
    results = agreement_by_benchmark(records)
    assert results["thinker/a"]["modes"]["lookup"]["projected_speedup"] == pytest.approx(2.0)
    assert results["thinker/b"]["modes"]["lookup"]["projected_speedup"] == pytest.approx(2.0)
    assert results["thinker/b"]["modes"]["lookup"]["measured_speedup"] == pytest.approx(3.0)


def _model() -> StepCostModel:
    coefficients = dict.fromkeys(TERMS, 0.0) | dict(fixed=1e-3, per_row=1e-5, per_token=1e-6, kv_decode=1e-9)
    return StepCostModel(coefficients, 0, Buckets())


def test_a_cost_model_is_checked_on_every_point_of_another_grid(tmp_path: Path):
    model = _model()
    shapes = [(1, 1, 256), (4, 16, 1024), (32, 1, 4096)]
    points = [
        {"rows": r, "tokens": t, "keys": k, "seconds": model.seconds(r, t, k) * f, "held_out": False}
        for (r, t, k), f in zip(shapes, (1.0, 1.0, 1.25))
    ]
    check = cost_model_check(model, grid_points({"points": points}))
    assert check["points"] == 3 and check["within"] == 2
    assert check["max_abs_error"] == pytest.approx(0.2) and check["worst"] == {"rows": 32, "tokens": 1, "keys": 4096}
    model.save(tmp_path / "m.json")
    (tmp_path / "g.json").write_text(json.dumps({"shape": "x", "points": points}))
    out = tmp_path / "check.json"
    result = CliRunner().invoke(
        app, ["bench", "check-cost-model", str(tmp_path / "m.json"), str(tmp_path / "g.json"), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "2 of 3 shapes within 10%" in " ".join(result.output.split())
    assert json.loads(out.read_text())["within"] == 2
    (tmp_path / "bad.json").write_text("{}")
    result = CliRunner().invoke(
        app, ["bench", "check-cost-model", str(tmp_path / "m.json"), str(tmp_path / "bad.json")]
    )
    assert result.exit_code == 2 and "not a step grid" in " ".join(result.output.split())


def test_replay_check_command_writes_its_figures(tmp_path: Path):
    path = tmp_path / "replayed.jsonl"
    path.write_text(
        "\n".join(json.dumps(r) for r in [_record("s1", "baseline", 2.0, 2.0), _record("s1", "lookup", 1.0, 1.1)])
    )
    out = tmp_path / "check.json"
    result = CliRunner().invoke(app, ["bench", "replay-check", str(path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["benchmarks"]["thinker/a"]["modes"]["lookup"]
    assert figures["projected_speedup"] == pytest.approx(2.0 / 1.1)
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"sample_id": "s", "mode": "baseline"}) + "\n")
    assert CliRunner().invoke(app, ["bench", "replay-check", str(empty)]).exit_code == 2
