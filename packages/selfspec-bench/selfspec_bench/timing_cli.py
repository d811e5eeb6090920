"""`selfspec bench replay`, `price` and `step-grid`: a run's decisions timed at another size or on
another device (a random-weight model of a served shape, or a fitted step-cost model).

Kept apart from the bench command itself: these take records or shapes, not a model and a
benchmark, and share the shape, cost-model and schedule machinery (`replay`, `step_grid`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer()
console = Console(stderr=True)


@app.command()
def replay(
    inputs: list[str] = typer.Argument(..., help="JSONL records written by `selfspec bench` with --record-schedule."),
    shape: str = typer.Option(..., "--shape", help="The model shape to time at (selfspec_bench.shapes.SHAPES)."),
    out: str = typer.Option(..., "--out", help="JSONL file of the projected records (replaced)."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16."),
    host_scale: float = typer.Option(
        1.0, "--host-scale", help="Factor on the recorded time between forwards (1.0: the same Python at any size)."
    ),
    warm_forwards: int = typer.Option(
        8, "--warm-forwards", min=0, help="Untimed forwards of each record replayed before its timed replay."
    ),
    cost_model: Optional[str] = typer.Option(
        None,
        "--cost-model",
        help="A step-cost model of this shape (`selfspec bench step-grid`): each record also gets its prediction of the forward time (replay.model_gpu_s).",
    ),
    samples: Optional[int] = typer.Option(
        None,
        "--samples",
        min=1,
        help="Only each file's first N samples (every mode of them): a large model's replay costs its runs' GPU time.",
    ),
    pace: bool = typer.Option(
        False,
        "--pace/--no-pace",
        help="Keep the host busy between forwards for the recorded mean host time per forward (untimed), as in the measured run.",
    ),
) -> None:
    """Replay each record's forward schedule on a random-weight model of --shape; write the records
    with the projected latency (`selfspec bench report OUT` compares the modes at that size)."""
    from selfspec_bench.replay import ReplayError, replay_files
    from selfspec_bench.shapes import SHAPES

    if shape not in SHAPES:
        console.print(f"[red]error:[/] --shape {shape!r}: choose from {', '.join(sorted(SHAPES))}")
        raise typer.Exit(2)
    try:
        records = replay_files(
            [Path(p) for p in inputs],
            shape,
            Path(out),
            device=device,
            dtype=dtype,
            host_scale=host_scale,
            warm_forwards=warm_forwards,
            cost_model=Path(cost_model) if cost_model else None,
            samples=samples,
            pace=pace,
        )
    except ReplayError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    replayed = [r for r in records if "replay" in r]
    console.print(f"{len(replayed)} records replayed at {shape} -> {out}")
    for r in replayed:
        console.print(
            f"  {r['sample_id']}  {r['mode']}: measured {r['measured_latency_s']:.3f} s, projected {r['latency_s']:.3f} s "
            f"(forwards {r['replay']['gpu_s']:.3f} s, host {r['replay']['host_s']:.3f} s"
            + (f", cost model {r['replay']['model_gpu_s']:.3f} s" if "model_gpu_s" in r["replay"] else "")
            + ")"
        )


def _int_list(option: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        console.print(f"[red]error:[/] {option} {text!r}: a comma list of positive integers")
        raise typer.Exit(2)
    return values


@app.command()
def price(
    inputs: list[str] = typer.Argument(..., help="JSONL records written by `selfspec bench` with --record-schedule."),
    cost_model: str = typer.Option(..., "--cost-model", help="A step-cost model (`selfspec bench step-grid`)."),
    out: str = typer.Option(..., "--out", help="JSONL file of the priced records (replaced)."),
    host_scale: float = typer.Option(
        0.0, "--host-scale", help="Factor on the recorded time between forwards (0: forward time only)."
    ),
) -> None:
    """Price each record's forward schedule with a step-cost model instead of replaying it on a
    device: `latency_s` = the model's forward time + recorded host time x --host-scale."""
    from selfspec_bench.replay import ReplayError, price_files

    try:
        records = price_files([Path(p) for p in inputs], Path(cost_model), Path(out), host_scale=host_scale)
    except ReplayError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"{sum('replay' in r for r in records)} records priced -> {out}")


@app.command("step-grid")
def step_grid(
    shape: str = typer.Option(..., "--shape", help="The model shape to time (selfspec_bench.shapes.SHAPES)."),
    out_dir: str = typer.Option(..., "--out-dir", help="Where <shape>_grid.json and <shape>_cost_model.json go."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16."),
    rows: str = typer.Option("1,2,4,8,16,32", help="Rows per forward (comma list)."),
    tokens: str = typer.Option("1,2,4,8,16,32,64", help="Tokens per row (comma list)."),
    keys: str = typer.Option("256,1024,4096", help="Key lengths a row attends over (comma list)."),
    warm: int = typer.Option(2, min=1, help="Untimed runs per shape (the first builds its static forward)."),
    repeats: int = typer.Option(10, min=1, help="Timed runs per shape (the median is kept)."),
) -> None:
    """Time the engine's forward over a grid of step shapes on a random-weight model of --shape and
    fit the step-cost model (selfspec.engine.cost_model); one point in three is held out and checked."""
    from selfspec_bench.shapes import SHAPES
    from selfspec_bench.step_grid import run_grid

    if shape not in SHAPES:
        console.print(f"[red]error:[/] --shape {shape!r}: choose from {', '.join(sorted(SHAPES))}")
        raise typer.Exit(2)
    grid = _int_list("--rows", rows), _int_list("--tokens", tokens), _int_list("--keys", keys)
    try:
        model, check = run_grid(
            shape,
            Path(out_dir),
            device=device,
            dtype=dtype,
            rows=grid[0],
            tokens=grid[1],
            keys=grid[2],
            warm=warm,
            repeats=repeats,
        )
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    _print_fit(model, check)


def _print_fit(model, check: dict) -> None:
    """A fitted step-cost model's coefficients, its fit error and its held-out check."""
    coef = ", ".join(f"{k} {v:.3g}" for k, v in model.coefficients.items())
    console.print(f"{model.shape} on {model.device} ({model.dtype}): knee {model.knee} tokens; {coef}")
    console.print(
        f"fit on {model.fit_error['points']} shapes: rms {model.fit_error['rms']:.1%}, max {model.fit_error['max_abs']:.1%}; "
        + (
            f"held out {check['held_out']}: mean {check['mean_abs_error']:.1%}, max {check['max_abs_error']:.1%}, "
            f"{check['within_10pct']} within 10%"
            if check["held_out"]
            else "nothing held out"
        )
    )


@app.command("refit-grid")
def refit_grid_command(
    grid: str = typer.Argument(..., help="A <shape>_grid.json written by `selfspec bench step-grid`."),
    out: str = typer.Option(..., "--out", help="Where the refitted <shape>_cost_model.json goes."),
    model: Optional[str] = typer.Option(
        None, "--model", help="The model fitted to the grid, for its buckets and signature (default: beside the grid)."
    ),
) -> None:
    """Fit a measured grid again in the current step-cost form (no device): its held-out shapes
    are checked as when it was measured."""
    from selfspec_bench.step_grid import refit_grid

    try:
        fitted, check = refit_grid(Path(grid), Path(out), Path(model) if model else None)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    _print_fit(fitted, check)


@app.command("replay-check")
def replay_check(
    inputs: list[str] = typer.Argument(..., help="JSONL records written by `selfspec bench replay`."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the figures here."),
) -> None:
    """Replayed against measured: per mode the speedup over the baseline both ways and each
    record's projected-latency error (the replay's validation when the shape is the recording one)."""
    import json

    from selfspec_bench.jsonl import read_jsonl
    from selfspec_bench.replay_validation import agreement_by_benchmark

    try:
        records = [r for path in inputs for r in read_jsonl(Path(path))]
        results = agreement_by_benchmark(records)
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    for benchmark, result in results.items():
        console.print(
            f"{benchmark}, {result['records']} records: projected latency within {result['mean_abs_error']:.1%} of "
            f"measured on average (max {result['max_abs_error']:.1%})"
        )
        for mode, row in result["modes"].items():
            speed = (
                f"speedup measured {row['measured_speedup']:.3f}x, projected {row['projected_speedup']:.3f}x "
                f"({row['speedup_difference']:+.3f}); "
                if "speedup_difference" in row
                else ""
            )
            console.print(
                f"  {mode}: {speed}record error mean {row['mean_abs_error']:.1%}, max {row['max_abs_error']:.1%}",
                soft_wrap=True,
            )
    if json_out:
        Path(json_out).write_text(json.dumps({"inputs": inputs, "benchmarks": results}, indent=1) + "\n")


@app.command("check-cost-model")
def check_cost_model(
    model: str = typer.Argument(..., help="A <shape>_cost_model.json (`selfspec bench step-grid` or `refit-grid`)."),
    grid: str = typer.Argument(..., help="A <shape>_grid.json measured in another run, none of it fitted."),
    tolerance: float = typer.Option(0.10, "--tolerance", min=0.0, help="Relative error counted as within."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the per-point errors here."),
) -> None:
    """A fitted step-cost model against every point of a grid from another run: the out-of-sample
    test of a model whose form was chosen on its own grid."""
    import json

    from selfspec_bench.replay_validation import cost_model_check, grid_points, load_model

    try:
        fitted = load_model(Path(model))
        record = json.loads(Path(grid).read_text())
        result = cost_model_check(fitted, grid_points(record), tolerance)
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if fitted.shape and record.get("shape") and fitted.shape != record["shape"]:
        console.print(f"[yellow]warning:[/] the model is of {fitted.shape}, the grid of {record['shape']}")
    worst = result["worst"]
    console.print(
        f"{result['within']} of {result['points']} shapes within {tolerance:.0%}; mean {result['mean_abs_error']:.1%}, "
        f"max {result['max_abs_error']:.1%} ({worst['rows']}x{worst['tokens']} at {worst['keys']} keys)"
    )
    if json_out:
        Path(json_out).write_text(json.dumps({"model": model, "grid": grid, **result}, indent=1) + "\n")
