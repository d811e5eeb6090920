"""How close the decode step's GEMMs come to the memory-bandwidth floor, per weight shape.

At batch 1–8 a decode step's linear layers read each weight once and do almost no arithmetic
per byte, so their floor is weight bytes / copy bandwidth. This times `F.linear` (cuBLAS) for
every distinct weight shape of a model's layer (fused q/k/v, o, fused gate/up, down, LM head)
at M = 1..8 rows, each inside a CUDA graph of many back-to-back calls (launch cost excluded,
as in the engine's captured steps), against a device-to-device copy of the same bytes.

    python benchmarks/gemm_efficiency.py --shape qwen3-4b --json gemm_qwen3-4b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from step_profile import SHAPES  # noqa: E402

from selfspec.engine.skinny_gemm import graph_seconds_per_call  # noqa: E402


def layer_weights(name: str) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each GEMM a decode step runs, as the engine fuses them."""
    s = SHAPES[name]
    hidden, inter = s["hidden_size"], s["intermediate_size"]
    heads, kv = s["num_attention_heads"], s["num_key_value_heads"]
    head_dim = s.get("head_dim", hidden // heads)
    return {
        "qkv": ((heads + 2 * kv) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (s["vocab_size"], hidden),
    }


def time_graph(fn, reps: int) -> float:
    """Seconds per call of `fn`, `reps` calls back to back inside one CUDA graph."""

    def body() -> None:
        for _ in range(reps):
            fn()

    return graph_seconds_per_call(body, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dtype, device = torch.bfloat16, torch.device("cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_s = time_graph(lambda: dst.copy_(src), 10)
    bandwidth = 2 * src.numel() / copy_s  # a copy reads and writes every byte (engine_speed's floor rule)
    src = dst = None
    rows = []
    for label, (n, k) in layer_weights(args.shape).items():
        w = torch.randn(n, k, dtype=dtype, device=device)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, dtype=dtype, device=device)
            out = torch.empty(m, n, dtype=dtype, device=device)
            sec = time_graph(lambda x=x, w=w, out=out: torch.matmul(x, w.t(), out=out), args.reps)
            floor = w.numel() * w.element_size() / bandwidth
            rows.append(
                {
                    "gemm": label,
                    "n": n,
                    "k": k,
                    "m": m,
                    "us": 1e6 * sec,
                    "floor_us": 1e6 * floor,
                    "of_floor": floor / sec,
                }
            )
            print(
                f"{args.shape} {label:8s} {n:6d}x{k:5d} M={m}: {1e6 * sec:8.1f} us, floor {1e6 * floor:7.1f} us, "
                f"{100 * floor / sec:5.1f}% of floor"
            )
        del w
    result = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
