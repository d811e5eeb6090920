"""`selfspec bench replay`: a bench run's forward schedules timed at another model size.

Why: the bench's comparisons run on small models (a launch-bound GPU step) while users serve
4B-8B models (bandwidth-bound steps), where the same decisions cost other ratios. Every token
decision is the small model's; only the timing is re-measured. Each record's schedule
(`selfspec.engine.schedule`, written by `selfspec bench --record-schedule`) runs through the
engine's own runner (same `ModelRunner`, slot cache, static forwards and CUDA graphs as a served
engine) on a random-weight model of the named shape (`shapes.SHAPES`), with the recorded slot
copies, rollbacks and frees applied in order and token ids of zeros in the recorded shapes.

Projection: latency = the replayed forwards' time (each synchronised by the runner's host copy
of the greedy tokens) + the recorded host time x `host_scale`, where the recorded host time is
the record's latency less the time its own forwards took. The default scale 1.0 says the work
between forwards (proposals, commits, policies, drafting bookkeeping) is the same Python at any
model size: it reads token ids and sequence state, never hidden states. Forwards of another
runner (SpS's draft model, CoSpec's arbitrator) and sampling on logits are host time in a
schedule and are not rescaled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from selfspec.engine.model_runner import Chunk, ModelRunner
from selfspec.engine.schedule import Forward, Free, Rollback, Schedule, ScheduleError, SlotCopy, decode
from selfspec_bench.jsonl import JsonlError, append_jsonl, iter_jsonl
from selfspec_bench.modes import SKIPPED

# What a projection replaces: the run's phase timings were measured on the recording model.
PHASE_TIMINGS = ("ttft_s", "thinking_s", "first_answer_token_s", "answer_s")


class ReplayError(ValueError):
    """Records that cannot be replayed (no schedule, a bad schedule, an unknown shape)."""


@dataclass
class Timed:
    """One schedule's replay: the forwards' time and what they fed."""

    gpu_s: float
    forwards: int
    tokens: int


def load_records(inputs: Iterable[Path], samples: int | None = None) -> list[tuple[dict[str, Any], Schedule | None]]:
    """Every record of the inputs with its decoded schedule (None for skip records); with
    `samples`, only the records of each file's first `samples` samples (every mode of them).

    All schedules are checked before anything runs: a record without one fails here, named by
    file, line, sample and mode, rather than after the GPU time of the records before it."""
    out: list[tuple[dict[str, Any], Schedule | None]] = []
    for path in map(Path, inputs):
        if not path.exists():
            raise ReplayError(f"records file not found: {path}")
        try:
            lines = list(iter_jsonl(path, bad_lines="skip-last"))
        except JsonlError as exc:
            raise ReplayError(str(exc)) from None
        kept: list[Any] = []
        for lineno, rec in lines:
            if not isinstance(rec, dict) or "sample_id" not in rec or "mode" not in rec:
                raise ReplayError(f"{path}:{lineno}: not a bench record (needs 'sample_id' and 'mode')")
            if samples is not None and rec["sample_id"] not in kept:
                if len(kept) >= samples:
                    continue
                kept.append(rec["sample_id"])
            if rec["mode"] == SKIPPED:
                out.append((rec, None))
                continue
            where = f"{path}:{lineno} (sample {rec['sample_id']}, mode {rec['mode']})"
            if not isinstance(rec.get("schedule"), dict):
                raise ReplayError(
                    f"{where} has no forward schedule: record the run with `selfspec bench --record-schedule` "
                    "(one request at a time; a batched run keeps one `batch_schedule` for the whole batch, "
                    "which projects no single request's latency, and external modes keep none)"
                )
            if not isinstance(rec.get("latency_s"), (int, float)):
                raise ReplayError(f"{where} has no latency_s")
            try:
                out.append((rec, decode(rec["schedule"])))
            except ScheduleError as exc:
                raise ReplayError(f"{where}: {exc}") from None
    if not out:
        raise ReplayError("no bench records in " + ", ".join(str(p) for p in inputs))
    return out


def replay_runner(model: torch.nn.Module, schedules: list[Schedule]) -> ModelRunner:
    """The engine's runner over `model`, sized for every schedule, as a served engine builds it
    (on a GPU: static forwards, CUDA graphs, compiled pieces, slot attention, skinny GEMMs)."""
    from selfspec.engine.config import EngineConfig
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.static_forward import GraphBuckets

    buckets = next((s.buckets for s in schedules if s.buckets), None)
    config = EngineConfig(
        num_slots=max(s.num_slots for s in schedules),
        max_len=max(s.max_len for s in schedules),
        clamp_max_len=True,
        graph_buckets=GraphBuckets(tokens=tuple(buckets)) if buckets else GraphBuckets(),
        static_shapes=any(s.static for s in schedules),
    )
    return Engine(model, None, config, eos_token_ids=[]).runner


def warm_up(runner: ModelRunner, schedules: list[Schedule]) -> float:
    """CUDA graphs for every row count and key length the schedules reach (as the bench's warm-up
    captures them before its timed runs); seconds spent."""
    if runner.static is None or not runner.static.capture:
        return 0.0
    rows = sorted({len(f.rows) for s in schedules for f in s.forwards})
    longest = max((r.start + r.tokens for s in schedules for f in s.forwards for r in f.rows), default=1)
    return runner.warm_up_graphs(rows, list(runner.static.buckets.tokens), min(longest, runner.max_len))


def replay(
    runner: ModelRunner,
    schedule: Schedule,
    *,
    token_ids: bool = False,
    limit: int | None = None,
    clock=None,
    pace: bool = False,
) -> Timed:
    """Run `schedule` through `runner`; time each forward.

    `token_ids`: feed the recorded ids (a schedule recorded with `keep_tokens`), so the cache ends
    as the recorded run left it; otherwise zeros. `limit`: stop after this many forwards (warm-up).
    `pace`: keep the host busy between forwards for the recorded run's mean host time per
    forward (untimed), so the device sees the gaps it saw when the run was measured instead of
    forwards back to back: whether that changes a forward's time is what comparing a paced and
    an unpaced replay of the same records shows.
    """
    clock = clock or time.perf_counter
    if token_ids and any(f.token_ids is None for f in schedule.forwards):
        raise ReplayError("the schedule keeps no token ids (record it with keep_tokens=True)")
    zeros: dict[int, list[int]] = {}
    gpu = 0.0
    forwards = tokens = 0
    gap = schedule.host_s / max(1, len(schedule.forwards)) if pace else 0.0
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    for event in schedule.events:
        if isinstance(event, Forward):
            if limit is not None and forwards >= limit:
                break
            chunks = [
                Chunk(
                    r.slot,
                    r.start,
                    list(event.token_ids[i]) if token_ids else zeros.setdefault(r.tokens, [0] * r.tokens),
                    r.logits,
                )
                for i, r in enumerate(event.rows)
            ]
            want = [r.want for r in event.rows]
            if gap:
                until = time.perf_counter() + gap
                while time.perf_counter() < until:  # busy, as the engine's Python is between forwards
                    pass
            started = clock()
            runner.run(chunks, want)  # ends with the greedy tokens' device-to-host copy: synchronised
            gpu += clock() - started
            forwards += 1
            tokens += sum(r.tokens for r in event.rows)
        elif isinstance(event, SlotCopy):
            runner.copy_slot(event.src, event.dst, event.length)
        elif isinstance(event, Rollback):
            runner.settle(event.slot, event.position)
        elif isinstance(event, Free):
            runner.release_slot(event.slot)
    return Timed(gpu, forwards, tokens)


def projected(
    rec: dict[str, Any], schedule: Schedule, timed: Timed, host_scale: float, about: dict[str, Any]
) -> dict[str, Any]:
    """The record with its latency projected (module docstring), the measured one kept beside it."""
    out = dict(rec)
    out.pop("schedule", None)
    measured = float(rec["latency_s"])
    host = max(0.0, measured - schedule.gpu_s)
    out["measured_latency_s"] = measured
    out["latency_s"] = timed.gpu_s + host * host_scale
    for key in PHASE_TIMINGS:  # measured on the recording model; not projected
        if key in out:
            out["measured_" + key] = out[key]
            out[key] = None
    out["measured_device"], out["measured_dtype"] = rec.get("device"), rec.get("dtype")
    out["device"] = f"{about['device_name']} (replay at {about['shape']})"
    out["dtype"] = about["dtype"]
    out["replay"] = {
        "shape": about["shape"],
        "device": about["device_name"],
        "dtype": about["dtype"],
        "versions": about["versions"],
        "gpu_s": timed.gpu_s,
        "host_s": host * host_scale,
        "host_scale": host_scale,
        "measured_gpu_s": schedule.gpu_s,
        "measured_host_s": host,
        "forwards": timed.forwards,
        "tokens": timed.tokens,
    }
    return out


def replay_files(
    inputs: list[Path],
    shape: str,
    out: Path,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    host_scale: float = 1.0,
    warm_forwards: int = 8,
    progress: bool = True,
    cost_model: Path | None = None,
    samples: int | None = None,
    pace: bool = False,
) -> list[dict[str, Any]]:
    """Replay every record of `inputs` at `shape` and write the projected records to `out`
    (replaced). Returns them. `samples`: only each file's first that many samples. With `cost_model` (a `selfspec bench step-grid` fit of this shape),
    each record also gets the model's prediction of its forward time (`replay.model_gpu_s`). `pace`:
    `replay`'s pacing."""
    from tqdm import tqdm

    from selfspec.run_info import device_name, library_versions
    from selfspec_bench.shapes import SHAPES, shaped_model

    if shape not in SHAPES:
        raise ReplayError(f"unknown shape {shape!r}; choose from {', '.join(sorted(SHAPES))}")
    if host_scale < 0:
        raise ReplayError(f"--host-scale must be >= 0, got {host_scale}")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ReplayError(f"unknown dtype {dtype!r}; choose float32, bfloat16 or float16")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ReplayError(f"--device {device}: no CUDA device here")
    predictor = None
    if cost_model is not None:
        from selfspec.engine.cost_model import StepCostModel

        try:
            predictor = StepCostModel.load(cost_model)
        except (OSError, ValueError) as exc:
            raise ReplayError(f"--cost-model {cost_model}: {exc}") from None
    records = load_records(inputs, samples)
    schedules = [s for _, s in records if s is not None]
    model = shaped_model(shape, torch_dtype, device)
    runner = replay_runner(model, schedules) if schedules else None
    if runner is not None:
        warm_up(runner, schedules)
    about = {"shape": shape, "device_name": device_name(device), "dtype": dtype, "versions": library_versions()}
    written: list[dict[str, Any]] = []
    for rec, schedule in tqdm(records, desc=f"replay at {shape}", unit="record", disable=not progress):
        if schedule is None:
            written.append(dict(rec))
            continue
        if warm_forwards:  # this sample's prefill shape and first steps, untimed (the bench's short runs)
            replay(runner, schedule, limit=warm_forwards)
        rec_out = projected(rec, schedule, replay(runner, schedule, pace=pace), host_scale, about)
        rec_out["replay"]["paced"] = pace
        if predictor is not None:
            from selfspec_bench.step_grid import schedule_seconds

            rec_out["replay"]["model_gpu_s"] = schedule_seconds(predictor, schedule.forwards)
        written.append(rec_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    append_jsonl(out, written)
    return written


def price_files(
    inputs: list[Path], cost_model: Path, out: Path, *, host_scale: float = 0.0, samples: int | None = None
) -> list[dict[str, Any]]:
    """Each record of `inputs` with its latency priced by a step-cost model (the sum of its
    forwards' predicted times + the recorded host time x `host_scale`), written to `out`: a
    replay without a device, for what-ifs (`selfspec bench --step-cost-prior` runs decide as the
    model's device would; this prices those decisions on it)."""
    from selfspec.engine.cost_model import StepCostModel
    from selfspec.run_info import library_versions
    from selfspec_bench.step_grid import schedule_seconds

    if host_scale < 0:
        raise ReplayError(f"--host-scale must be >= 0, got {host_scale}")
    try:
        model = StepCostModel.load(cost_model)
    except (OSError, ValueError) as exc:
        raise ReplayError(f"--cost-model {cost_model}: {exc}") from None
    about = {
        "shape": f"{model.shape or 'model'} (cost model)",
        "device_name": model.device or "unknown device",
        "dtype": model.dtype,
        "versions": library_versions(),
    }
    written: list[dict[str, Any]] = []
    for rec, schedule in load_records(inputs, samples):
        if schedule is None:
            written.append(dict(rec))
            continue
        timed = Timed(schedule_seconds(model, schedule.forwards), len(schedule.forwards), schedule.fed_tokens())
        written.append(projected(rec, schedule, timed, host_scale, about))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    append_jsonl(out, written)
    return written
