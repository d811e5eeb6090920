"""The host's part of a decode step as the batch grows: what every row adds outside the forward.

Why: at 32 rows our Qwen3-4B step on the H200 was 5.03 ms where its graph replay was 4.06 ms
(`benchmarks/engine_speed/README.md`), so about a millisecond of every batched step was host
work per row (packing the step's inputs, reading the greedy tokens back, committing, checking
stops) during which the GPU sat idle; vLLM's whole step was 4.01 ms. That work does not depend
on the model's size, so it is measured here on a tiny random-weight model whose forward is
cheap, on any device, with the engine's static-shape path (what CUDA graphs replay; uncaptured
on a CPU).

Per batch size: plain greedy decoding of `--new-tokens` tokens per row (EOS ignored), the wall
time per step, the engine's own host phases per step (`engine.host_phases`: scheduling and
proposals, commits, the policies' hooks) and the static path's input packing per step, timed
alone. `--repeats` runs per batch, the median kept.

    python benchmarks/batch_host_time.py --batches 1,8,32 --out benchmarks/engine_speed/records/cpu/batch_host

Writes `batch_host.json` and `batch_host.md` (command, device, versions, date, the table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk
from selfspec.engine.sampling import SamplingParams
from selfspec.run_info import device_name
from selfspec.testing.tiny import tiny_model, tiny_tokenizer

PROMPT = list(range(5, 45))


def decode_batch(engine: Engine, batch: int, new_tokens: int) -> tuple[float, int, dict[str, float]]:
    """One batch decoded to the end: seconds, steps, host seconds per phase."""
    seqs = [engine.add_request(PROMPT, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for _ in range(batch)]
    engine.host_phases.reset()
    if engine.runner.static is not None and engine.runner.device.type == "cuda":
        torch.cuda.synchronize()
    began, steps = time.perf_counter(), 0
    while not all(s.is_finished for s in seqs):
        engine.step()
        steps += 1
    wall = time.perf_counter() - began
    return wall, steps, dict(engine.host_phases.seconds)


def packing_us(engine: Engine, batch: int, reps: int = 2000) -> float:
    """Microseconds to pack one decode step of `batch` rows into the static path's input buffer."""
    static = engine.runner.static
    chunks = [Chunk(slot=i, start=len(PROMPT) + i, token_ids=[7], num_logits=1) for i in range(batch)]
    shape = static.shape_for(chunks)
    for _ in range(100):
        static._pack(chunks, shape)
    began = time.perf_counter()
    for _ in range(reps):
        static._pack(chunks, shape)
    return 1e6 * (time.perf_counter() - began) / reps


def measure(args: argparse.Namespace) -> list[dict]:
    tok = tiny_tokenizer()
    rows = []
    for family in args.families:
        model = tiny_model(family, vocab_size=len(tok), num_layers=args.layers).to(args.device)
        rows += measure_family(args, family, model, tok)
    return rows


def measure_family(args: argparse.Namespace, family: str, model, tok) -> list[dict]:
    """The rows of one model family: a hybrid's recurrent-state bookkeeping is host work a dense
    model does not have."""
    rows = []
    for batch in args.batches:
        engine = Engine(model, tok, EngineConfig(num_slots=batch, max_len=512, static_shapes=True))
        decode_batch(engine, batch, 16)  # warm-up: every shape built once
        runs = [decode_batch(engine, batch, args.new_tokens) for _ in range(args.repeats)]
        wall, steps, phases = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        row = {
            "family": family,
            "batch": batch,
            "steps": steps,
            "step_ms": round(1e3 * wall / steps, 4),
            "step_ms_runs": [round(1e3 * w / s, 4) for w, s, _ in runs],
            **{f"{phase}_us_per_step": round(1e6 * sec / steps, 1) for phase, sec in phases.items()},
            "pack_us_per_step": round(packing_us(engine, batch), 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        del engine
    return rows


def markdown(result: dict) -> str:
    phases = list(dict.fromkeys(k for r in result["rows"] for k in r if k.endswith("_us_per_step")))
    phases.remove("pack_us_per_step")
    head = " | ".join(p.removesuffix("_us_per_step") + " µs" for p in phases)
    lines = [
        "# The host's part of a decode step by batch size",
        "",
        f"`{result['command']}`",
        "",
        f"{result['device']}, torch {result['torch']}, Python {result['python']}, {result['date']}; tiny random-weight "
        f"models ({', '.join(result.get('families', ['llama']))}; {result['layers']} layers), static-shape path, {result['new_tokens']} new tokens a row, median of "
        f"{result['repeats']} runs.",
        "",
        f"| model | batch | steps | step ms | {head} | input packing µs |",
        "|---|---|---|---|" + "---|" * len(phases) + "---|",
    ]
    for r in result["rows"]:
        values = " | ".join(str(r.get(p, "")) for p in phases)
        lines.append(
            f"| {r.get('family', 'llama')} | {r['batch']} | {r['steps']} | {r['step_ms']} | {values} | "
            f"{r['pack_us_per_step']} |"
        )
    lines += ["", "Phases per step (`engine.host_phases`); input packing timed alone, inside the forward's time."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32", type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--families",
        default="llama",
        type=lambda s: [f for f in s.split(",") if f],
        help="tiny model families, comma-separated (llama; qwen3_5 for the hybrid's state bookkeeping)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.new_tokens < 1 or not args.batches or min(args.batches) < 1:
        ap.error("--repeats, --new-tokens and every batch size must be at least 1")
    if args.device == "cpu":
        torch.set_num_threads(1)  # the host's work, not the forward's threads, is what is measured
    rows = measure(args)
    result = {
        "command": "python benchmarks/batch_host_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": device_name(args.device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "layers": args.layers,
        "families": args.families,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "batch_host.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "batch_host.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
