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

SHAPES = {
    "smollm2": dict(
        family="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
    ),
    "gemma3-270m": dict(
        family="gemma3",
        vocab_size=262144,
        hidden_size=640,
        intermediate_size=2048,
        num_hidden_layers=18,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        sliding_window=512,
        query_pre_attn_scalar=256,
    ),
    # The reasoning models users serve (published configs; random weights of these shapes).
    "qwen3-4b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    "qwen3-8b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    # DeepSeek-R1-Distill-Qwen-7B.
    "qwen2-7b": dict(
        family="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    ),
    # Qwen3.5-4B's text model, from its published config as recalled (not read from the hub):
    # Gated DeltaNet layers with a full-attention layer every 4th (8 of 32), gated attention with
    # partial rotary. Least sure: hidden/intermediate sizes and the linear-attention head counts.
    "qwen3.5-4b": dict(
        family="qwen3_5",
        vocab_size=248320,
        hidden_size=2560,
        intermediate_size=9216,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        full_attention_interval=4,
        tie_word_embeddings=True,
        max_position_embeddings=262144,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    ),
    # Gemma-4-E4B's text model, as recalled: 42 layers (sliding:full 5:1, window 512), full
    # layers with head dim 512, the last 18 layers reuse earlier K/V, 256-wide per-layer inputs.
    # Least sure: the layer and shared-layer counts, intermediate size and kv heads.
    "gemma4-e4b": dict(
        family="gemma4",
        vocab_size=262144,
        hidden_size=2560,
        intermediate_size=10240,
        num_hidden_layers=42,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        global_head_dim=512,
        sliding_window=512,
        num_kv_shared_layers=18,
        hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=262144,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
}

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


def shaped_config(name: str):
    """The transformers config of shape `name` (also what vLLM's dummy-weight runs load)."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    spec = dict(SHAPES[name])
    family = spec.pop("family")
    if family == "gemma3":
        n = spec["num_hidden_layers"]
        spec["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
        config = Gemma3TextConfig(**spec)
    elif family == "qwen3":
        config = Qwen3Config(**spec)
    elif family == "qwen2":
        config = Qwen2Config(**spec)
    elif family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        config = Qwen3_5TextConfig(**spec)
    elif family == "gemma4":
        from transformers import Gemma4TextConfig

        config = Gemma4TextConfig(**spec)  # default layer types: every 6th layer full
    else:
        config = LlamaConfig(**spec)
    return config


def shaped_model(name: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    config = shaped_config(name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval().requires_grad_(False)


def profile_body(engine: Engine, shape: tuple[int, int, int]) -> dict:
    static = engine.runner.static
    forward = static.forwards.get(shape) or static._build(shape)
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
            results[key] = r = profile_body(engine, shape)
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
