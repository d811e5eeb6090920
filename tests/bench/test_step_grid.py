"""The step-cost model (`selfspec.engine.cost_model`) and its grid (`selfspec bench step-grid`):
the fit recovers a known model, never goes negative, rounds shapes as the static forwards do,
round-trips as data; the grid measures through the engine's runner and holds points out; a
replay with the model predicts each record's forward time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from selfspec.cli.main import app
from selfspec.engine.cost_model import TERMS, Buckets, StepCostModel, StepPoint, fit
from selfspec.engine.schedule import Forward, Row, decode
from selfspec.testing.tiny import save_tiny_model_dir
from selfspec_bench import shapes
from selfspec_bench.step_grid import fit_grid, grid_runner, held_out, measure, refit_grid, schedule_seconds

TINY_SHAPE = dict(
    family="llama",
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=1024,
)
GRID = [(r, t, k) for r in (1, 2, 4, 8, 16, 32) for t in (1, 2, 4, 8, 16, 32, 64) for k in (256, 1024, 4096)]
# An H100-like 8B model: ~9.5 ms floor, compute-bound past ~300 fed tokens.
TRUE = dict(
    fixed=9.5e-3,
    per_row=2e-5,
    per_token=1e-6,
    compute=3e-5,
    kv_decode=2.2e-8,
    kv_verify=1.5e-8,
    attn=1e-10,
    log_keys=3e-5,
)


def _true_model(knee: int = 256, buckets: Buckets = Buckets()) -> StepCostModel:
    return StepCostModel(dict(TRUE), knee, buckets)


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args, catch_exceptions=False)


@pytest.fixture()
def tiny_shape(monkeypatch):
    monkeypatch.setitem(shapes.SHAPES, "tiny-grid", TINY_SHAPE)
    return "tiny-grid"


def test_the_fit_recovers_a_known_model_on_points_it_never_saw():
    truth = _true_model()
    points = [StepPoint(r, t, k, truth.seconds(r, t, k)) for r, t, k in GRID]
    train = [p for i, p in enumerate(points) if i % 3]
    model = fit(train)
    assert model.knee == 256
    for term in TERMS:
        assert model.coefficients[term] == pytest.approx(TRUE[term], rel=1e-6, abs=1e-15)
    assert max(abs(e) for e in model.relative_errors(points[::3])) < 1e-9
    assert model.fit_error["rms"] < 1e-9 and model.fit_error["points"] == len(train)


def test_noisy_points_give_nonnegative_coefficients_and_a_bounded_error():
    rng = np.random.default_rng(0)
    truth = _true_model(knee=128)
    points = [StepPoint(r, t, k, truth.seconds(r, t, k) * rng.uniform(0.97, 1.03)) for r, t, k in GRID]
    model = fit(points)
    assert all(v >= 0 for v in model.coefficients.values())
    assert max(abs(e) for e in model.relative_errors(points)) < 0.08
    # A term the data cannot support (here: decreasing cost with more rows) is dropped, not negative.
    falling = [StepPoint(r, 1, 256, 1e-3 * (2 - r / 32)) for r in range(1, 33)] + [
        StepPoint(1, t, 256, 1e-3 * (1 + t / 64)) for t in (2, 4, 8, 16)
    ]
    assert fit(falling).coefficients["per_row"] == 0.0


def test_shapes_round_up_to_the_static_forwards_buckets_and_run_eagerly_beyond():
    buckets = Buckets(batch=(1, 2, 4), tokens=(1, 4, 16), min_keys=128, max_len=1000)
    assert buckets.round(3, 5, 129) == (4, 16, 256)
    assert buckets.round(1, 1, 900) == (1, 1, 1000)  # the last key bucket is the cache length
    assert buckets.round(5, 2, 300) == (5, 2, 300)  # more rows than any bucket: eager, real size
    assert buckets.round(2, 17, 300) == (2, 17, 300)
    assert Buckets().round(3, 5, 7) == (3, 5, 7)
    model = _true_model(buckets=buckets)
    assert model.seconds(3, 5, 129) == model.seconds(4, 16, 256)


def test_a_model_round_trips_as_data_and_bad_data_is_refused(tmp_path: Path):
    model = _true_model(buckets=Buckets((1, 2), (1, 8), 128, 4096))
    model.shape, model.device, model.dtype = "qwen3-8b", "NVIDIA H100", "bfloat16"
    path = tmp_path / "m.json"
    model.save(path)
    back = StepCostModel.load(path)
    assert back == model
    assert back.seconds(2, 8, 1000) == model.seconds(2, 8, 1000)
    with pytest.raises(ValueError, match="missing"):
        StepCostModel.from_dict({"coefficients": {"fixed": 1.0}, "knee": 0})
    with pytest.raises(ValueError, match=">= 1"):
        model.seconds(0, 1, 1)
    with pytest.raises(ValueError, match="at least"):
        fit([StepPoint(1, 1, 1, 1.0)])


def test_a_model_of_the_older_form_reads_with_the_same_predictions():
    """Models fitted before the key read was split by step kind (one `kv_read`, no `log_keys`) load
    as kv_decode = kv_verify = kv_read and log_keys = 0."""
    legacy = {"coefficients": dict(fixed=1e-3, per_row=1e-5, per_token=1e-6, compute=2e-5, kv_read=3e-8, attn=1e-9)}
    model = StepCostModel.from_dict({**legacy, "knee": 64})
    for rows, tokens, keys in ((1, 1, 256), (8, 1, 4096), (4, 16, 1024)):
        fed = rows * tokens
        want = 1e-3 + 1e-5 * (rows - 1) + 1e-6 * fed + 2e-5 * max(0, fed - 64) + 3e-8 * rows * keys + 1e-9 * fed * keys
        assert model.seconds(rows, tokens, keys) == pytest.approx(want)


def test_a_committed_grid_is_refitted_without_a_device(tmp_path: Path):
    """`refit_grid` / `selfspec bench refit-grid`: the grid's points and held-out marks, the fitted
    model's buckets and signature, the current form; a missing model or a bad grid is refused."""
    truth = _true_model(buckets=Buckets((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64), 128, 4096))
    points = [
        {"rows": r, "tokens": t, "keys": k, "seconds": truth.seconds(r, t, k), "held_out": i % 3 == 0}
        for i, (r, t, k) in enumerate(GRID)
    ]
    grid = tmp_path / "big_grid.json"
    grid.write_text(json.dumps({"shape": "big", "points": points}))
    old = StepCostModel({**dict(TRUE), "kv_decode": 0.0}, 0, truth.buckets, shape="big", device="NVIDIA H100")
    old.signature = {"hidden_size": 4096}
    old.save(tmp_path / "big_cost_model.json")
    model, check = refit_grid(grid, tmp_path / "out" / "big_cost_model.json")
    assert check["held_out"] == sum(p["held_out"] for p in points) and check["within_10pct"] == check["held_out"]
    assert model.signature == {"hidden_size": 4096} and model.buckets == truth.buckets and model.device == "NVIDIA H100"
    assert StepCostModel.load(tmp_path / "out" / "big_cost_model.json") == model
    result = _invoke(["bench", "refit-grid", str(grid), "--out", str(tmp_path / "cli.json")])
    assert result.exit_code == 0, result.output
    assert "within 10%" in result.output
    (tmp_path / "lone").mkdir()
    lone = tmp_path / "lone" / "big_grid.json"
    lone.write_text(grid.read_text())
    assert _invoke(["bench", "refit-grid", str(lone), "--out", str(tmp_path / "x.json")]).exit_code == 2
    lone.write_text("{}")
    result = _invoke(["bench", "refit-grid", str(lone), "--out", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "not a step grid" in " ".join(result.output.split())


def test_the_grid_runs_through_the_engine_runner_and_holds_a_third_out(tiny_shape):
    model = shapes.shaped_model(tiny_shape, shapes.torch.float32, "cpu")
    runner = grid_runner(model, rows=4, max_len=256)
    points = measure(runner, rows=(1, 2, 4), tokens=(1, 4, 16), keys=(16, 128), warm=1, repeats=2, progress=False)
    assert [(p.rows, p.tokens, p.keys) for p, _ in points] == [
        (r, t, k) for r in (1, 2, 4) for t in (1, 4, 16) for k in (16, 128)
    ]
    assert all(p.seconds > 0 for p, _ in points)
    assert sum(out for _, out in points) == 6 and held_out((0, 1, 0)) and not held_out((0, 0, 0))
    assert runner.forwards == 18 * 3
    cost_model, check = fit_grid(points, Buckets())
    assert check["held_out"] == 6 and 0 <= check["within_10pct"] <= 6
    assert cost_model.fit_error["held_out"] is check
    with pytest.raises(ValueError, match="slots"):
        measure(runner, rows=(8,), tokens=(1,), keys=(16,), progress=False)


def test_a_schedules_predicted_time_is_the_sum_of_its_padded_forwards():
    model = _true_model()
    forwards = [Forward((Row(0, 0, 20, 1),)), Forward((Row(0, 20, 1, 1), Row(1, 20, 5, 5)))]
    assert schedule_seconds(model, forwards) == pytest.approx(model.seconds(1, 20, 20) + model.seconds(2, 5, 25))


def test_step_grid_cli_writes_the_grid_and_a_model_that_replay_uses(tmp_path: Path, tiny_shape):
    out_dir = tmp_path / "grid"
    result = _invoke(
        ["bench", "step-grid", "--shape", tiny_shape, "--out-dir", str(out_dir), "--rows", "1,2", "--tokens", "1,4,8"]
        + ["--keys", "32,128", "--repeats", "2", "--warm", "1"]
    )
    assert result.exit_code == 0, result.output
    grid = json.loads((out_dir / f"{tiny_shape}_grid.json").read_text())
    assert len(grid["points"]) == 12 and grid["shape"] == tiny_shape and "torch" in grid["versions"]
    assert grid["check"]["held_out"] == sum(p["held_out"] for p in grid["points"])
    model_path = out_dir / f"{tiny_shape}_cost_model.json"
    StepCostModel.load(model_path)

    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    records = tmp_path / "r.jsonl"
    limits = ["--cot-cap", "24", "--draft-budget", "8", "--max-draft", "16", "--answer-cap", "16"]
    result = _invoke(
        ["bench", "-b", "humaneval", "--limit", "2", "--model", str(model_dir), "--modes", "baseline,prompt-lookup"]
        + limits
        + ["--out", str(records)]
    )
    assert result.exit_code == 0, result.output
    projected = tmp_path / "p.jsonl"
    result = _invoke(
        [
            "bench",
            "replay",
            str(records),
            "--shape",
            tiny_shape,
            "--out",
            str(projected),
            "--cost-model",
            str(model_path),
        ]
    )
    assert result.exit_code == 0, result.output
    loaded = StepCostModel.load(model_path)
    for raw, new in zip(records.read_text().splitlines(), projected.read_text().splitlines()):
        schedule = decode(json.loads(raw)["schedule"])
        assert json.loads(new)["replay"]["model_gpu_s"] == pytest.approx(schedule_seconds(loaded, schedule.forwards))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--shape", "gpt-9"], "gpt-9"),
        (["--shape", "smollm2", "--rows", "1,x"], "--rows"),
        (["--shape", "smollm2", "--keys", "0"], "--keys"),
        (["--shape", "smollm2", "--dtype", "float8"], "float8"),
    ],
)
def test_step_grid_refuses_bad_options_with_exit_2(tmp_path: Path, args, message):
    result = _invoke(["bench", "step-grid", "--out-dir", str(tmp_path / "g"), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "g").exists()


def test_a_bad_cost_model_file_stops_the_replay_before_it_runs(tmp_path: Path, tiny_shape):
    bad = tmp_path / "m.json"
    bad.write_text('{"knee": 3}')
    records = tmp_path / "r.jsonl"
    records.write_text("")
    result = _invoke(["bench", "replay", str(records), "--shape", tiny_shape, "--out", "o", "--cost-model", str(bad)])
    assert result.exit_code == 2 and "cost-model" in result.output


def test_packaged_priors_match_by_model_shape_and_device():
    from selfspec.engine.cost_model import PRIORS_DIR, packaged_prior, signature

    config = shapes.shaped_config("qwen3-8b")
    prior = packaged_prior(config, "NVIDIA H100 80GB HBM3")
    assert prior is not None and prior.shape == "qwen3-8b" and prior.signature == signature(config)
    assert packaged_prior(config, "NVIDIA H200") is None  # measured on another device: not this one's prior
    assert packaged_prior(shapes.shaped_config("qwen2-7b"), "NVIDIA H100 80GB HBM3") is None
    assert packaged_prior(None, "NVIDIA H100 80GB HBM3") is None
    assert {p.stem for p in PRIORS_DIR.glob("*.json")} >= {"smollm2_h100", "qwen3-4b_h100", "qwen3-8b_h100"}


def test_a_prior_prices_unmeasured_shapes_scaled_to_the_measured_decode_step(tiny_shape):
    from selfspec.engine.step_costs import StepCosts, engine_step_costs
    from selfspec.spec.proposal_length import choose_length, cost_ratio

    prior = _true_model(buckets=Buckets((1, 2, 4), (1, 4, 16, 64), 128, 4096))
    costs = StepCosts((1, 4, 16, 64), prior=prior, prior_keys=1024)
    assert costs.predicted(1, 16) == pytest.approx(prior.seconds(1, 16, 1024))
    assert cost_ratio(costs, 1, 16) == (pytest.approx(prior.seconds(1, 16, 1024) / prior.seconds(1, 1, 1024)), "model")
    assert costs.row_cost(1) == pytest.approx(prior.seconds(2, 1, 1024) / prior.seconds(1, 1, 1024) - 1)
    assert choose_length(costs, rows=1, alpha=0.8, room=64).cost_from == "model"
    for _ in range(16):  # this engine's decode step is twice the prior's: the prior is scaled to it
        costs.observe([1], 2 * prior.seconds(1, 1, 1024))
    assert costs.predicted(1, 16) == pytest.approx(2 * prior.seconds(1, 16, 1024))
    assert cost_ratio(costs, 1, 1) == (1.0, "measured")
    frozen = StepCosts((1, 4), prior=prior, frozen=True)
    frozen.observe([1], 1.0)
    assert frozen.seconds(1, 1, min_samples=1) is None
    # An engine on a CPU keeps no prior (the packaged ones were measured on GPUs).
    runner = grid_runner(shapes.shaped_model(tiny_shape, shapes.torch.float32, "cpu"), rows=1, max_len=64)
    assert engine_step_costs(runner, None).prior is None


def test_a_what_if_run_decides_on_a_frozen_prior_and_price_sums_its_forwards(tmp_path: Path):
    """`selfspec bench --step-cost-prior M` decides as M's device would (frozen step costs on the
    bucketed path); `selfspec bench price` then prices the schedules with M, without a device."""
    prior = _true_model(buckets=Buckets((1, 2, 4, 8), (1, 2, 4, 8, 16, 32, 64), 128, 4096))
    prior.shape, prior.device, prior.dtype = "big", "NVIDIA H100 80GB HBM3", "bfloat16"
    model_path = tmp_path / "prior.json"
    prior.save(model_path)
    model_dir = save_tiny_model_dir(tmp_path / "m", "qwen3")
    records = tmp_path / "r.jsonl"
    limits = ["--cot-cap", "24", "--draft-budget", "8", "--max-draft", "16", "--answer-cap", "16"]
    result = _invoke(
        ["bench", "-b", "humaneval", "--limit", "1", "--model", str(model_dir), "--modes", "baseline,auto"]
        + limits
        + ["--out", str(records), "--step-cost-prior", str(model_path)]
    )
    assert result.exit_code == 0, result.output
    raw = [json.loads(line) for line in records.read_text().splitlines()]
    assert all(r["decided_as"] == "big on NVIDIA H100 80GB HBM3 (bfloat16)" for r in raw)
    assert raw[1]["auto"]["last_choice"]["cost_from"] in ("model", "measured")
    priced = tmp_path / "p.jsonl"
    result = _invoke(["bench", "price", str(records), "--cost-model", str(model_path), "--out", str(priced)])
    assert result.exit_code == 0, result.output
    for rec, new in zip(raw, (json.loads(line) for line in priced.read_text().splitlines())):
        forwards = decode(rec["schedule"]).forwards
        assert new["latency_s"] == pytest.approx(schedule_seconds(prior, forwards))  # host scale 0
        assert new["measured_latency_s"] == rec["latency_s"] and new["replay"]["host_s"] == 0.0
    bad = _invoke(["bench", "price", str(records), "--cost-model", str(tmp_path / "none.json"), "--out", "x"])
    assert bad.exit_code == 2 and "cost-model" in bad.output
