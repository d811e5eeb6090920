"""Where a decode step's GPU time goes: kernels per step, their time, and graph replay time.

Runs on a random-weight model with a real model's shapes (speed does not depend on the
weights' values, so no model files need to travel to the GPU machine):

    python benchmarks/step_profile.py --shape smollm2 --keys 512
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk
from selfspec_bench.shapes import SHAPES, shaped_config, shaped_model  # noqa: F401 (imported from here by other scripts)

# Kernel classes of a step's GPU time, matched in order on the lower-cased kernel name.
KERNEL_CLASSES = (
    ("gemm", ("gemm", "gemv", "xmma", "cutlass", "splitk", "cublas", "matmul", "sm90_", "nvjet")),
    ("attention", ("slot_attention", "attn", "attention", "fmha", "flash")),
    ("sampling", ("argmax", "topk", "softmax", "sort")),
    ("fused pointwise (inductor)", ("triton_",)),
    ("copies, indexing", ("copy", "memcpy", "memset", "index", "scatter", "gather", "cat")),
    ("eager pointwise", ("elementwise", "vectorized", "unrolled", "reduce")),
)


def kernel_class(name: str) -> str:
    low = name.lower()
    for label, needles in KERNEL_CLASSES:
        if any(n in low for n in needles):
            return label
    return "other"


def profile_body(engine: Engine, shape: tuple[int, int, int], verify: bool = False, fill: bool = False) -> dict:
    """One forward of `shape` under the profiler; `verify`: the variant a linear-attention model's
    verify chunks replay (it also keeps what a rollback needs), else the plain one; `fill`: rows in
    slots 0..B-1 whose tokens end at the key bucket, so attention reads that many keys a row (else
    the capture's inputs: every row at position 0, attention over a key or a few)."""
    static = engine.runner.static
    built = static.snapshot_forwards if verify else static.forwards
    forward = built.get(shape) or static._build(shape, verify)
    if fill:
        b, t, k = shape
        rows = [Chunk(slot=i, start=k - t, token_ids=[1] * t, num_logits=t) for i in range(b)]
        forward.packed.copy_(static._pack(rows, shape))
    for _ in range(3):
        static._body(forward)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        static._body(forward)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = collections.defaultdict(list)
    classes: dict[str, list[float]] = collections.defaultdict(list)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            kernels[evt.name[:90]].append(evt.device_time)
            classes[kernel_class(evt.name)].append(evt.device_time)
    total = sum(sum(v) for v in kernels.values())
    count = sum(len(v) for v in kernels.values())
    replay = float("nan")
    if forward.graph is not None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(5):
            forward.graph.replay()
        start.record()
        for _ in range(100):
            forward.graph.replay()
        end.record()
        end.synchronize()
        replay = start.elapsed_time(end) / 100
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:25]
    return {
        "kernels": count,
        "kernel_time_ms": total / 1e3,
        "graph_replay_ms": replay,
        "top": [(name, len(v), round(sum(v), 1)) for name, v in top],
        "classes": {
            label: {"kernels": len(v), "us": round(sum(v), 1)}
            for label, v in sorted(classes.items(), key=lambda kv: -sum(kv[1]))
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--keys", type=int, default=512)
    parser.add_argument("--batch", default="1", help="comma list of batch sizes")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--verify", action="store_true", help="the verify variant (linear-attention models)")
    parser.add_argument("--fill", action="store_true", help="each row attends over --keys keys (else position 0)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--variants", default="graph,graph+compile,graph+compile+slot,graph+compile+slot+skinny")
    args = parser.parse_args()
    model = shaped_model(args.shape, torch.bfloat16, "cuda")
    results = {}
    # In this order: the skinny GEMMs reroute the model's projections for every later engine.
    variants = {
        "graph": dict(compile_pointwise=False, slot_attention=False, skinny_gemms=False),
        "graph+compile": dict(compile_pointwise=True, slot_attention=False, skinny_gemms=False),
        "graph+compile+slot": dict(compile_pointwise=True, slot_attention=True, skinny_gemms=False),
        "graph+compile+slot+skinny": dict(compile_pointwise=True, slot_attention=True, skinny_gemms=True),
    }
    for label, cfg in variants.items():
        if label not in args.variants.split(","):
            continue
        engine = Engine(
            model,
            None,
            EngineConfig(num_slots=32, max_len=max(2048, args.keys), cuda_graphs=True, **cfg),
            eos_token_ids=[],
        )
        for batch in (int(b) for b in args.batch.split(",")):
            shape = (batch, args.tokens, args.keys)
            key = label if batch == 1 else f"{label} B={batch}"
            results[key] = r = profile_body(engine, shape, args.verify, args.fill)
            r["graph_stats"] = engine.runner.static.stats()
            if engine.skinny_gemms is not None:
                r["skinny_gemms"] = engine.skinny_gemms.report()
            print(
                f"== {args.shape} {label} B={batch} T={args.tokens} K={args.keys}: {r['kernels']} kernels, "
                f"kernel time {r['kernel_time_ms']:.3f} ms, graph replay {r['graph_replay_ms']:.3f} ms"
            )
            for label_, c in r["classes"].items():
                print(f"  class {label_:28s} {c['us']:8.1f} us  x{c['kernels']:4d}")
            for name, n, us in r["top"][: args.top]:
                print(f"  {us:8.1f} us  x{n:4d}  {name}")
            if "skinny_gemms" in r:
                print(f"  skinny: {json.dumps(r['skinny_gemms'])}")
        del engine
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
