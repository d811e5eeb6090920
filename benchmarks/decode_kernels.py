"""Two of the engine's own decode kernels timed alone on a GPU, each variant in one CUDA graph.

Why alone: a whole-model A/B of a kernel variant needs minutes of capture per variant, while the
question is one kernel's time at a few shapes. This answers it in seconds, launch cost excluded
as in the engine's captured steps (`skinny_gemm.graph_seconds_per_call`):

- the slot delta rule (`engine/slot_delta_rule.py`) with and without its prefetching token loop
  (`SELFSPEC_SLOT_RULE_PREFETCH`), 1 / 8 / 32 tokens a row, at Qwen3.5-4B's Gated DeltaNet heads
  (16 key heads, 32 value heads, 128 x 128), 1 and 8 rows; the two loops' outputs and states are
  compared bit for bit;
- slot attention (`engine/slot_attention.py`) with 512, 256 and 128 keys per split, one query token
  a row, at Qwen3-8B's heads (32 query, 8 K/V, dim 128), 1 and 32 rows over 256 to 8,192 cached keys;
  outputs compared against 512's.

Per-step figures multiply by the layers that run the kernel (24 Gated DeltaNet layers in
Qwen3.5-4B, 36 attention layers in Qwen3-8B).

    python benchmarks/decode_kernels.py --out benchmarks/engine_speed/records/h100/decode_kernels
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from selfspec.engine import slot_attention, slot_delta_rule
from selfspec.engine.skinny_gemm import graph_seconds_per_call

REPS = 20  # calls per captured graph
DEVICE = "cuda"  # --smoke: "cpu", the kernels under Triton's interpreter, untimed


def seconds_per_call(body, reps: int) -> float:
    if DEVICE == "cpu":
        body()
        return float("nan")
    return graph_seconds_per_call(body, reps)


def time_delta_rule(rows: int, tokens: int, prefetch: bool, gen: torch.Generator) -> tuple[float, tuple]:
    """µs per call, and (out, states) of one call from the same inputs."""
    hk, hv, dk, dv = 16, 32, 128, 128
    dev = DEVICE
    q = torch.randn(rows, tokens, hk, dk, generator=gen).to(dev, torch.bfloat16)
    k = torch.randn(rows, tokens, hk, dk, generator=gen).to(dev, torch.bfloat16)
    v = torch.randn(rows, tokens, hv, dv, generator=gen).to(dev, torch.bfloat16)
    g = (-torch.rand(rows, tokens, hv, generator=gen)).to(dev)
    beta = torch.rand(rows, tokens, hv, generator=gen).to(dev, torch.bfloat16)
    states = (0.1 * torch.randn(rows + 1, hv, dk, dv, generator=gen)).to(dev)
    slots = torch.arange(rows, device=dev)
    fresh = torch.zeros(rows, dtype=torch.bool, device=dev)
    slot_delta_rule.PREFETCH = prefetch  # read by `run` at each call
    first = states.clone()
    out, _ = slot_delta_rule.run(q, k, v, g, beta, first, slots, fresh, keep_initial=tokens > 1)
    work = states.clone()

    def body() -> None:
        for _ in range(REPS):
            slot_delta_rule.run(q, k, v, g, beta, work, slots, fresh, keep_initial=tokens > 1)

    seconds = seconds_per_call(body, REPS)
    return 1e6 * seconds, (out, first)


def attention_inputs(rows: int, keys: int) -> tuple:
    """Qwen3-8B's heads: query [rows, 32, 1, 128], caches of rows + 1 slots over the key bucket."""
    hq, hkv, d = 32, 8, 128
    bucket = max(128, 1 << (keys - 1).bit_length())
    torch.manual_seed(rows * 100_000 + keys)
    k_cache = torch.randn(rows + 1, hkv, bucket, d, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn(rows + 1, hkv, bucket, d, device=DEVICE, dtype=torch.bfloat16)
    query = torch.randn(rows, hq, 1, d, device=DEVICE, dtype=torch.bfloat16)
    slots = torch.arange(rows, device=DEVICE)
    positions = torch.full((rows, 1), keys - 1, dtype=torch.long, device=DEVICE)
    return query, k_cache, v_cache, slots, positions, bucket


def time_attention(inputs: tuple, per_split: int) -> tuple[float, torch.Tensor]:
    """µs per call with `per_split` keys a program, and one call's output."""
    query, k_cache, v_cache, slots, positions, bucket = inputs
    slot_attention.KEYS_PER_SPLIT = per_split  # read by `slot_attention` at each call

    def call() -> torch.Tensor:
        scale = query.shape[-1] ** -0.5
        return slot_attention.slot_attention(query, k_cache, v_cache, slots, positions, scale=scale, key_length=bucket)

    out = call()

    def body() -> None:
        for _ in range(REPS):
            call()

    return 1e6 * seconds_per_call(body, REPS), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for decode_kernels.json and .md")
    parser.add_argument("--splits", default="512,256,128")
    parser.add_argument("--keys", default="256,512,2048,8192")
    parser.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1: the script's logic only")
    args = parser.parse_args()
    global DEVICE, REPS
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1")
        DEVICE, REPS = "cpu", 1
    elif not torch.cuda.is_available():
        raise SystemExit("decode_kernels.py times CUDA kernels: no CUDA device here")
    t0 = time.perf_counter()
    rule = []
    for rows in (1,) if args.smoke else (1, 8):
        for tokens in (1, 4) if args.smoke else (1, 8, 32):
            on_us, on = time_delta_rule(rows, tokens, True, torch.Generator().manual_seed(rows * 100 + tokens))
            off_us, off = time_delta_rule(rows, tokens, False, torch.Generator().manual_seed(rows * 100 + tokens))
            same = all(torch.equal(a, b) for a, b in zip(on, off))
            rule.append({"rows": rows, "tokens": tokens, "prefetch_us": on_us, "plain_us": off_us, "same_bits": same})
            print(
                f"delta rule rows={rows} tokens={tokens}: prefetch {on_us:.2f} us, plain {off_us:.2f} us, same bits {same}"
            )
    attention = []
    splits = [int(x) for x in args.splits.split(",")]
    for rows in (1, 2) if args.smoke else (1, 32):
        for keys in (int(x) for x in args.keys.split(",")):
            row = {"rows": rows, "keys": keys}
            reference = None
            inputs = attention_inputs(rows, keys)
            for per_split in splits:
                us, out = time_attention(inputs, per_split)
                row[f"split{per_split}_us"] = us
                if reference is None:
                    reference = out
                row[f"split{per_split}_max_diff"] = (out.float() - reference.float()).abs().max().item()
            attention.append(row)
            print(
                f"attention rows={rows} keys={keys}: " + ", ".join(f"{s}: {row[f'split{s}_us']:.2f} us" for s in splits)
            )
    result = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreted, untimed)",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": round(time.perf_counter() - t0, 1),
        "delta_rule": rule,
        "attention": attention,
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "decode_kernels.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"# Decode kernels alone on {result['device']} ({result['date']}, torch {result['torch']})",
        "",
        f"`python benchmarks/decode_kernels.py {' '.join(sys.argv[1:])}`: µs per call inside one CUDA graph.",
        "",
        "| slot delta rule | prefetch | plain | ratio | per Qwen3.5-4B step (24 layers), saved | same bits |",
        "|---|---|---|---|---|---|",
    ]
    for r in rule:
        saved = 24 * (r["plain_us"] - r["prefetch_us"]) / 1e3
        lines.append(
            f"| {r['rows']} rows x {r['tokens']} tokens | {r['prefetch_us']:.2f} | {r['plain_us']:.2f} | "
            f"{r['prefetch_us'] / r['plain_us']:.3f} | {saved:.3f} ms | {r['same_bits']} |"
        )
    lines += [
        "",
        "| slot attention | " + " | ".join(f"{s} keys/split" for s in splits) + " | per Qwen3-8B step (36 layers) |",
    ]
    lines.append("|---|" + "---|" * (len(splits) + 1))
    for r in attention:
        best = min(splits, key=lambda s: r[f"split{s}_us"])
        cells = " | ".join(f"{r[f'split{s}_us']:.2f}" for s in splits)
        per_step = 36 * (r[f"split{splits[0]}_us"] - r[f"split{best}_us"]) / 1e3
        lines.append(f"| {r['rows']} rows, {r['keys']} keys | {cells} | best {best}: {per_step:.3f} ms saved |")
    (out_dir / "decode_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
