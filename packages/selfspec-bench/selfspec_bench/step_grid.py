"""`selfspec bench step-grid`: a model shape's forward times over a grid of step shapes, and the
step-cost model fitted to them (`selfspec.engine.cost_model`).

Why: replays (`selfspec bench replay`) time whole runs at a size; a grid times each step shape
once, so a model of a few coefficients can stand in for the device (what-ifs, and the
speculation policy's prior on a device it has not measured). The grid runs through the same
runner a replay builds (static forwards, CUDA graphs, slot cache), so a grid point and a
replayed forward of the same shape cost the same.

Each point feeds `rows` rows of `tokens` tokens ending at `keys` positions (token ids zero,
every row asking logits for all its tokens, as decode and verify rows do); it runs `warm`
times untimed (the first builds and captures its static forward), then `repeats` times timed,
and keeps the median. One point in three is held out of the fit (a fixed pattern over the grid's
axes, so every row count, token count and key length is in both halves), and the model's error
on those says how far it can be trusted between measured shapes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from itertools import product
from pathlib import Path
from typing import Any, Sequence

import torch

from selfspec.engine.cost_model import Buckets, StepCostModel, StepPoint, fit, signature
from selfspec.engine.model_runner import Chunk, ModelRunner

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32)
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_KEYS = (256, 1024, 4096)


def grid_runner(model: torch.nn.Module, rows: int, max_len: int) -> ModelRunner:
    """The engine's runner over `model` as a served engine builds it, with a slot per row."""
    from selfspec.engine.config import EngineConfig
    from selfspec.engine.llm_engine import Engine

    config = EngineConfig(num_slots=rows, max_len=max_len, clamp_max_len=True)
    return Engine(model, None, config, eos_token_ids=[]).runner


def runner_buckets(runner: ModelRunner) -> Buckets:
    """The runner's static-forward rounding as the cost model applies it (none when eager)."""
    if runner.static is None:
        return Buckets()
    b = runner.static.buckets
    return Buckets(tuple(b.batch), tuple(b.tokens), b.min_keys, runner.max_len)


def time_shape(
    runner: ModelRunner, rows: int, tokens: int, keys: int, *, warm: int = 2, repeats: int = 10, clock=None
) -> float:
    """Median seconds of `runner.run` over `rows` rows of `tokens` tokens ending at `keys`."""
    clock = clock or time.perf_counter
    if keys < tokens:
        raise ValueError(f"keys ({keys}) must be >= tokens per row ({tokens})")
    chunks = [Chunk(slot, keys - tokens, [0] * tokens, tokens) for slot in range(rows)]
    want = [False] * rows
    for _ in range(warm):
        runner.run(chunks, want)
    times = []
    for _ in range(repeats):
        started = clock()
        runner.run(chunks, want)  # ends with the greedy tokens' host copy: synchronised
        times.append(clock() - started)
    for slot in range(rows):  # the grid's writes leave no state a later shape reads
        runner.release_slot(slot)
    return statistics.median(times)


def held_out(index: tuple[int, ...]) -> bool:
    """One grid point in three, on a diagonal pattern over the axes' indices."""
    return sum(index) % 3 == 1


def measure(
    runner: ModelRunner,
    rows: Sequence[int] = DEFAULT_ROWS,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    keys: Sequence[int] = DEFAULT_KEYS,
    *,
    warm: int = 2,
    repeats: int = 10,
    progress: bool = True,
) -> list[tuple[StepPoint, bool]]:
    """Every grid point's median time, with whether it is held out of the fit."""
    from tqdm import tqdm

    if max(rows) > runner.cache.num_slots:
        raise ValueError(f"{max(rows)} rows need as many slots; the runner has {runner.cache.num_slots}")
    shapes = [
        ((ri, ti, ki), (r, t, k))
        for (ri, r), (ti, t), (ki, k) in product(enumerate(rows), enumerate(tokens), enumerate(keys))
        if t <= k <= runner.max_len
    ]
    out = []
    for index, (r, t, k) in tqdm(shapes, desc="step grid", unit="shape", disable=not progress):
        seconds = time_shape(runner, r, t, k, warm=warm, repeats=repeats)
        out.append((StepPoint(r, t, k, seconds), held_out(index)))
    return out


def fit_grid(points: list[tuple[StepPoint, bool]], buckets: Buckets, **about: Any) -> tuple[StepCostModel, dict]:
    """The model fitted to the grid's kept points and its errors on the held-out ones."""
    train = [p for p, out in points if not out]
    test = [p for p, out in points if out]
    model = fit(train, buckets, **about)
    errors = model.relative_errors(test) if test else []
    check = {
        "held_out": len(test),
        "max_abs_error": max((abs(e) for e in errors), default=None),
        "mean_abs_error": statistics.fmean(abs(e) for e in errors) if errors else None,
        "within_10pct": sum(abs(e) <= 0.10 for e in errors),
    }
    model.fit_error["held_out"] = check
    return model, check


def run_grid(
    shape: str,
    out_dir: Path,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    rows: Sequence[int] = DEFAULT_ROWS,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    keys: Sequence[int] = DEFAULT_KEYS,
    warm: int = 2,
    repeats: int = 10,
    progress: bool = True,
) -> tuple[StepCostModel, dict]:
    """Measure the grid at `shape`, fit, and write `<shape>_grid.json` (every point, held out
    or not, with the run's device and versions) and `<shape>_cost_model.json` into `out_dir`."""
    import json

    from selfspec.run_info import device_name, library_versions
    from selfspec_bench.shapes import SHAPES, shaped_model

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(sorted(SHAPES))}")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; choose float32, bfloat16 or float16")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device here")
    if min(rows) < 1 or min(tokens) < 1 or min(keys) < 1:
        raise ValueError("grid rows, tokens and keys must be >= 1")
    model = shaped_model(shape, torch_dtype, device)
    runner = grid_runner(model, max(rows), max(keys))
    started = time.perf_counter()
    points = measure(runner, rows, tokens, keys, warm=warm, repeats=repeats, progress=progress)
    about = {"shape": shape, "device": device_name(device), "dtype": dtype}
    cost_model, check = fit_grid(points, runner_buckets(runner), **about)
    cost_model.signature = signature(model.config)
    out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        **about,
        "versions": library_versions(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.perf_counter() - started,
        "warm": warm,
        "repeats": repeats,
        "static": runner.static is not None,
        "graphs": bool(runner.static is not None and runner.static.capture),
        "points": [{**asdict(p), "held_out": out} for p, out in points],
        "check": check,
    }
    (out_dir / f"{shape}_grid.json").write_text(json.dumps(record, indent=1) + "\n")
    cost_model.save(out_dir / f"{shape}_cost_model.json")
    return cost_model, check


def refit_grid(grid_path: Path, out_path: Path, model_path: Path | None = None) -> tuple[StepCostModel, dict]:
    """A measured grid fitted again in the current form, without a device: the points (and which
    were held out) from `grid_path` (`<shape>_grid.json`), the buckets, device, dtype and model
    signature from the model fitted to it (`model_path`, default `<shape>_cost_model.json` beside
    the grid); the new model is written to `out_path`. Why: a change to the model's form should be
    checked on, and applied to, every grid already measured, not wait for GPU time."""
    import json

    grid_path = Path(grid_path)
    try:
        record = json.loads(grid_path.read_text())
        points = [
            (StepPoint(p["rows"], p["tokens"], p["keys"], p["seconds"]), bool(p["held_out"])) for p in record["points"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{grid_path}: not a step grid ({exc})") from None
    shape = record.get("shape") or grid_path.name.removesuffix("_grid.json")
    model_path = Path(model_path) if model_path is not None else grid_path.with_name(f"{shape}_cost_model.json")
    try:
        old = StepCostModel.load(model_path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{model_path}: the grid's fitted model is needed for its buckets ({exc})") from None
    about = {"shape": old.shape or shape, "device": old.device, "dtype": old.dtype}
    model, check = fit_grid(points, old.buckets, **about)
    model.signature = dict(old.signature)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    model.save(Path(out_path))
    return model, check


def schedule_seconds(model: StepCostModel, forwards: Sequence[Any]) -> float:
    """A schedule's forward time as the cost model predicts it: each forward at its rows, its
    longest row's tokens and the longest key length a row reaches (what a padded static forward
    runs). Beside a replay's measured forward time, this checks the model on real schedules."""
    total = 0.0
    for forward in forwards:
        rows = forward.rows
        total += model.seconds(len(rows), max(r.tokens for r in rows), max(r.start + r.tokens for r in rows))
    return total
