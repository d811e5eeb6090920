"""How well a projection agrees with what it projects: replayed records against their measured
latencies, and a fitted step-cost model against a grid measured in another run.

Why its own module: the replay's claim ("the 135M schedules replayed at 135M give the measured
speedups within ±0.05, each record within 10% on average") and the cost model's ("within 10% on
held-out shapes") are checks over committed files that anyone should be able to rerun without a
device, and that the validation pages quote. A grid measured in a later run is the clean test of a
model whose form was chosen after seeing the first grid's misses.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from selfspec.engine.cost_model import StepCostModel, StepPoint

BASELINE = "baseline"


def agreement_by_benchmark(records: list[dict]) -> dict[str, dict]:
    """`speedup_agreement` of each benchmark's records apart (a family's speedups are its own)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[str(r.get("benchmark"))].append(r)
    return {name: speedup_agreement(group) for name, group in sorted(groups.items())}


def speedup_agreement(records: list[dict]) -> dict:
    """Per mode: the paired mean speedup over the baseline, measured and projected, their
    difference, and the per-record relative error of the projected latency. `records` are replay
    outputs (`latency_s` projected, `measured_latency_s` measured); records of other kinds and
    samples without a baseline are left out."""
    by_sample: dict[tuple[str, str], dict[str, tuple[float, float]]] = defaultdict(dict)
    errors: dict[str, list[float]] = defaultdict(list)
    for r in records:
        if "replay" not in r or "measured_latency_s" not in r:
            continue
        measured, projected = float(r["measured_latency_s"]), float(r["latency_s"])
        if measured <= 0 or projected <= 0:
            continue
        by_sample[(str(r.get("benchmark")), str(r["sample_id"]))][r["mode"]] = (measured, projected)
        errors[r["mode"]].append(projected / measured - 1.0)
    if not errors:
        raise ValueError("no replayed records (with latency_s and measured_latency_s) in the input")
    modes: dict[str, dict] = {}
    for mode in sorted(errors):
        pairs = [(s[BASELINE], s[mode]) for s in by_sample.values() if mode in s and BASELINE in s]
        row: dict = {
            "records": len(errors[mode]),
            "mean_abs_error": statistics.fmean(abs(e) for e in errors[mode]),
            "max_abs_error": max(abs(e) for e in errors[mode]),
            "mean_error": statistics.fmean(errors[mode]),
        }
        if pairs and mode != BASELINE:
            measured = statistics.fmean(b[0] / m[0] for b, m in pairs)
            projected = statistics.fmean(b[1] / m[1] for b, m in pairs)
            row.update(samples=len(pairs), measured_speedup=measured, projected_speedup=projected)
            row["speedup_difference"] = projected - measured
        modes[mode] = row
    every = [abs(e) for values in errors.values() for e in values]
    differences = [abs(m["speedup_difference"]) for m in modes.values() if "speedup_difference" in m]
    return {
        "records": len(every),
        "mean_abs_error": statistics.fmean(every),
        "max_abs_error": max(every),
        "max_speedup_difference": max(differences, default=None),
        "modes": modes,
    }


def grid_points(record: dict) -> list[StepPoint]:
    """The measured points of a `<shape>_grid.json` record (held out or not)."""
    try:
        return [StepPoint(p["rows"], p["tokens"], p["keys"], p["seconds"]) for p in record["points"]]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a step grid ({exc})") from None


def cost_model_check(model: StepCostModel, points: list[StepPoint], tolerance: float = 0.10) -> dict:
    """The model's relative error on every point of a grid it was not fitted to."""
    if not points:
        raise ValueError("the grid has no points")
    errors = model.relative_errors(points)
    worst = max(range(len(points)), key=lambda i: abs(errors[i]))
    return {
        "points": len(points),
        "within": sum(abs(e) <= tolerance for e in errors),
        "tolerance": tolerance,
        "mean_abs_error": statistics.fmean(abs(e) for e in errors),
        "max_abs_error": abs(errors[worst]),
        "worst": {"rows": points[worst].rows, "tokens": points[worst].tokens, "keys": points[worst].keys},
        "errors": [
            {"rows": p.rows, "tokens": p.tokens, "keys": p.keys, "error": e}
            for p, e in zip(points, errors, strict=True)
        ],
    }


def load_model(path: Path) -> StepCostModel:
    try:
        return StepCostModel.load(Path(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a step-cost model ({exc})") from None
