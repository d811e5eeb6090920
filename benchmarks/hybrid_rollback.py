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
import statistics
import sys
import time
from pathlib import Path

import torch

from selfspec.engine.model_runner import Chunk, ModelRunner


def _model(layers: int, vocab: int, dtype: torch.dtype):
    sys.path.insert(0, str(Path(__file__).parent))
    from step_profile import SHAPES
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    spec = {k: v for k, v in SHAPES["qwen3.5-4b"].items() if k != "family"}
    spec.update(num_hidden_layers=layers, vocab_size=vocab)
    config = Qwen3_5TextConfig(**spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.eval().requires_grad_(False)


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the Qwen3.5-4B shape (3:1 linear)")
    parser.add_argument("--vocab", type=int, default=32000, help="smaller than 248k so the head does not dominate")
    parser.add_argument("--ks", default="2,4,8,16", help="proposal lengths (the verify chunk is k + 1 tokens)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model = _model(args.layers, args.vocab, getattr(torch, args.dtype))
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
        per_token = spec.heads * spec.k_dim * spec.v_dim * 4 * len(state.specs)
        row["snapshot_mib"] = round(per_token * (k + 2) / 2**20, 1)
        rows.append(row)
        print(
            f"k={k:3d}: no-rollback {row['no_rollback_ms']:.1f} ms, snapshots {row['snapshots_ms']:.1f} ms "
            f"({row['snapshots_ms'] / row['no_rollback_ms']:.2f}x), replay {row['replay_ms']:.1f} ms "
            f"({row['replay_ms'] / row['no_rollback_ms']:.2f}x); snapshots hold {row['snapshot_mib']} MiB per row"
        )
    meta = {
        "shape": f"qwen3.5-4b widths, {args.layers} layers, vocab {args.vocab}",
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
