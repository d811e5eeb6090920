"""What rolling back a linear-attention state costs in a verify step (random weights, real widths).

A verify forward of k tokens on a hybrid model (Qwen3.5, Qwen3-Next) must leave each Gated
DeltaNet state as if only the accepted tokens had been fed. The engine keeps the per-token
states of the chunk (the token-by-token recurrence materialises them; they are kept by
reference) and copies the accepted one back (`engine.state_cache`). Measured here, per verify
step of k tokens:

- `no-rollback`: the same forward with the chunked delta rule and only the final state — what
  a verify step would cost if the state never had to go back (wrong after a rejection);
- `snapshots`: the engine's verify forward (recurrence, every state kept) + settling on j;
- `replay`: the alternative design, checkpoint + replay: copy the state before the chunk, run
  the verify forward without snapshots, then restore and re-feed the j + 1 kept tokens (one
  more forward) whenever j + 1 < k + 1 tokens are kept.

    python benchmarks/hybrid_rollback.py --layers 4 --vocab 32000 --ks 2,4,8,16
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from selfspec.engine.model_runner import Chunk, ModelRunner


def _model(layers: int, vocab: int, dtype: torch.dtype, intermediate: int | None = None):
    sys.path.insert(0, str(Path(__file__).parent))
    from step_profile import SHAPES
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    spec = {k: v for k, v in SHAPES["qwen3.5-4b"].items() if k != "family"}
    spec.update(num_hidden_layers=layers, vocab_size=vocab)
    if intermediate:
        spec["intermediate_size"] = intermediate
    config = Qwen3_5TextConfig(**spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval().requires_grad_(False)


def _time(fn, repeats: int) -> float:
    """Best of `repeats` in ms (a shared CPU's noise only ever adds time)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def _core_costs(spec, k: int, repeats: int) -> dict:
    """One layer's delta rule alone for a (k + 1)-token chunk: the chunked rule (final state only)
    against the token recurrence keeping every state plus the settle copy."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    from selfspec.engine.linear_attention import recurrent_rule

    g = torch.Generator().manual_seed(2)
    t, kh = k + 1, spec.heads // 2
    q, key = (torch.randn(1, t, kh, spec.k_dim, generator=g) for _ in range(2))
    v = torch.randn(1, t, spec.heads, spec.v_dim, generator=g)
    decay = -torch.rand(1, t, spec.heads, generator=g)
    beta = torch.rand(1, t, spec.heads, generator=g)
    state = torch.randn(1, spec.heads, spec.k_dim, spec.v_dim, generator=g)
    slot = torch.empty_like(state[0])

    def chunk() -> None:
        torch_chunk_gated_delta_rule(
            q, key, v, g=decay, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
        )

    def snapshots() -> None:
        _, _, states = recurrent_rule(q, key, v, decay, beta, state, keep_states=True)
        slot.copy_(states[t // 2][0])

    return {"core_chunk_ms": _time(chunk, repeats), "core_snapshots_ms": _time(snapshots, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the Qwen3.5-4B shape (3:1 linear)")
    parser.add_argument("--vocab", type=int, default=32000, help="smaller than 248k so the head does not dominate")
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default: the 4B's)")
    parser.add_argument("--ks", default="2,4,8,16", help="proposal lengths (the verify chunk is k + 1 tokens)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = _model(args.layers, args.vocab, getattr(torch, args.dtype), args.intermediate)
    runner = ModelRunner(model, num_slots=2, max_len=args.context + 128)
    state = runner.state
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, args.vocab, (args.context,), generator=g).tolist()
    runner.run([Chunk(0, 0, prompt, 1)])
    saved = ({i: c[0].clone() for i, c in state.conv.items()}, {i: r[0].clone() for i, r in state.recurrent.items()})

    def reset() -> None:
        for i in state.specs:
            state.conv[i][0].copy_(saved[0][i])
            state.recurrent[i][0].copy_(saved[1][i])

    original_prepare = state.prepare_step

    def without_snapshots(*a, **kw):
        kw["snapshots"] = False
        return original_prepare(*a, **kw)

    rows = []
    decode = _time(lambda: (reset(), runner.run([Chunk(0, args.context, prompt[:1], 1)])), args.repeats)
    for k in [int(x) for x in args.ks.split(",")]:
        chunk = Chunk(0, args.context, prompt[: k + 1], k + 1)
        kept = (k + 1) // 2  # half the chunk accepted: a rollback is needed

        def snapshots() -> None:
            reset()
            runner.run([chunk])
            assert runner.settle(0, args.context + kept)

        def no_rollback() -> None:
            reset()
            state.prepare_step = without_snapshots
            try:
                runner.run([chunk])
            finally:
                state.prepare_step = original_prepare

        def replay() -> None:
            reset()
            state.checkpoint(0)
            no_rollback()
            state.restore(0)
            state.prepare_step = without_snapshots
            try:
                runner.run([Chunk(0, args.context, prompt[:kept], 1)])
            finally:
                state.prepare_step = original_prepare

        row = {
            "k": k,
            "no_rollback_ms": _time(no_rollback, args.repeats),
            "snapshots_ms": _time(snapshots, args.repeats),
            "replay_ms": _time(replay, args.repeats),
        }
        spec = next(iter(state.specs.values()))
        row.update(_core_costs(spec, k, args.repeats * 4))
        per_token = spec.heads * spec.k_dim * spec.v_dim * 4 * len(state.specs)
        row["snapshot_mib"] = round(per_token * (k + 2) / 2**20, 1)
        rows.append(row)
        print(
            f"k={k:3d}: no-rollback {row['no_rollback_ms']:.1f} ms, snapshots {row['snapshots_ms']:.1f} ms "
            f"({row['snapshots_ms'] / row['no_rollback_ms']:.2f}x), replay {row['replay_ms']:.1f} ms "
            f"({row['replay_ms'] / row['no_rollback_ms']:.2f}x); snapshots hold {row['snapshot_mib']} MiB per row; "
            f"one layer's delta rule: chunked {row['core_chunk_ms']:.2f} ms, recurrence + snapshots "
            f"{row['core_snapshots_ms']:.2f} ms"
        )
    meta = {
        "shape": f"qwen3.5-4b widths, {args.layers} layers, vocab {args.vocab}, mlp {args.intermediate or 'as 4b'}",
        "dtype": args.dtype,
        "context": args.context,
        "decode_ms": decode,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
    print(json.dumps(meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
