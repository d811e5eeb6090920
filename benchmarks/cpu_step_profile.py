"""What a multi-row decode step costs on a CPU against a one-row step, op by op.

SSR's draft rides in the parent's forwards, so while it drafts every step carries two rows. On a
CPU that second row should cost little (a small model's step is bound by reading its weights
once), but transformers' code and the BLAS paths it reaches were measured far from that. This
times `runner.run` at batch 1/2/4 (one decode token per row, every row's slot holding `--context`
cached tokens, as in the demo's CoT), interleaved over the batch sizes in every repeat, and
profiles each batch size with `torch.profiler` (self CPU time per op, per step).

    OMP_NUM_THREADS=2 python benchmarks/cpu_step_profile.py --context 900 --repeats 20
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from step_profile import shaped_model  # noqa: E402

from selfspec.engine.llm_engine import Engine, EngineConfig  # noqa: E402
from selfspec.engine.model_runner import Chunk  # noqa: E402


def fill_slots(engine: Engine, slots: int, context: int) -> None:
    """Prefill `context` tokens into each slot (pieces of 256, as chunked prefill runs them)."""
    g = torch.Generator().manual_seed(0)
    for slot in range(slots):
        tokens = torch.randint(10, 1000, (context,), generator=g).tolist()
        for start in range(0, context, 256):
            engine.runner.run([Chunk(slot, start, tokens[start : start + 256], 0)])


def decode_chunks(batch: int, context: int) -> list[Chunk]:
    return [Chunk(slot, context, [17 + slot], 1) for slot in range(batch)]


def time_steps(engine: Engine, batches: list[int], context: int, repeats: int) -> dict[int, list[float]]:
    """Seconds per `runner.run`, the batch sizes alternating within every repeat."""
    times: dict[int, list[float]] = {b: [] for b in batches}
    for b in batches:  # warm-up
        for _ in range(3):
            engine.runner.run(decode_chunks(b, context), [False] * b)
    for _ in range(repeats):
        for b in batches:
            chunks = decode_chunks(b, context)
            t0 = time.perf_counter()
            engine.runner.run(chunks, [False] * b)
            times[b].append(time.perf_counter() - t0)
    return times


def profile_ops(engine: Engine, batch: int, context: int, steps: int) -> dict[str, dict[str, float]]:
    """Self CPU time per op name, per step (ms), and calls per step."""
    from torch.profiler import ProfilerActivity, profile

    chunks = decode_chunks(batch, context)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.runner.run(chunks, [False] * batch)
    ops: dict[str, dict[str, float]] = collections.defaultdict(lambda: {"ms": 0.0, "calls": 0})
    for evt in prof.key_averages():
        ops[evt.key]["ms"] += evt.self_cpu_time_total / 1e3 / steps
        ops[evt.key]["calls"] += evt.count / steps
    return dict(ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2")
    parser.add_argument("--context", type=int, default=900)
    parser.add_argument("--batches", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = shaped_model(args.shape, torch.float32, "cpu")
    engine = Engine(model, None, EngineConfig(num_slots=max(batches), max_len=args.context + 64))
    fill_slots(engine, max(batches), args.context)
    times = time_steps(engine, batches, args.context, args.repeats)
    base = statistics.median(times[1]) if 1 in times else None
    print(f"threads {torch.get_num_threads()}, context {args.context}, {args.repeats} interleaved repeats")
    print("| batch | median ms | min | max | vs batch 1 |")
    print("|---|---|---|---|---|")
    for b in batches:
        med = statistics.median(times[b])
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"| {b} | {1e3 * med:.1f} | {1e3 * min(times[b]):.1f} | {1e3 * max(times[b]):.1f} | {ratio} |")
    profiles = {b: profile_ops(engine, b, args.context, args.profile_steps) for b in batches}
    names = sorted(
        {n for p in profiles.values() for n in p},
        key=lambda n: -max(p.get(n, {"ms": 0})["ms"] for p in profiles.values()),
    )
    print("\n| op (self CPU ms per step, calls) | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for name in names[: args.top]:
        cells = []
        for b in batches:
            op = profiles[b].get(name)
            cells.append("-" if op is None else f"{op['ms']:.2f} ({op['calls']:.0f})")
        print(f"| `{name}` | " + " | ".join(cells) + " |")
    totals = [sum(o["ms"] for o in profiles[b].values()) for b in batches]
    print("| total self CPU | " + " | ".join(f"{t:.1f}" for t in totals) + " |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "threads": torch.get_num_threads(),
                    "context": args.context,
                    "torch": torch.__version__,
                    "times_s": {str(b): v for b, v in times.items()},
                    "profiles": {str(b): p for b, p in profiles.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
