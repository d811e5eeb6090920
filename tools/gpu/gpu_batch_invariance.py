"""Do one-token decode steps and multi-token verify steps compute the same logits? (GPU probe)

Every lossless speculative mode relies on it: a verify forward scores k drafted tokens at once,
and greedy decoding would have scored them one at a time. In fp32 the engine matches token for
token (tests); in bf16 any kernel whose summation order depends on the number of rows in a
forward (GEMM tiling, inductor's autotuned reductions) can round a row differently, and a
near-tie then flips. This measures how often, on the real model and the engine's own forwards
(CUDA graphs, fused twins, slot attention):

    python tools/gpu/gpu_batch_invariance.py --model smollm2 --tokens 2400 --chunk 16 --out probe.json
    python tools/gpu/gpu_batch_invariance.py --tokens 6000 --chunk 1,6,11,20,40 --companion --out mixed.json

Slot 0 decodes `--tokens` tokens greedily one at a time (EOS ignored); slot 1, prefilled with
the same prompt, scores the same tokens in forwards of `--chunk` tokens (one size, or a cycle of
sizes that reaches every token bucket; with `--companion` a third slot decodes in the same
forwards). Printed and written: the share of positions whose logits are bitwise equal, whose
argmax agrees, and the largest absolute difference, overall, per 512 positions (the
slot-attention kernel splits keys per 512) and per verify-forward size. Run it with SELFSPEC_INDUCTOR_DETERMINISTIC=0 and =1 to see what inductor's
deterministic mode changes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from selfspec.engine.fusion import inductor_modes  # noqa: E402
from selfspec.engine.llm_engine import EngineConfig  # noqa: E402
from selfspec.engine.model_runner import Chunk  # noqa: E402
from selfspec.engine.static_forward import GraphBuckets  # noqa: E402
from selfspec.llm import LLM  # noqa: E402
from selfspec.run_info import device_name, library_versions  # noqa: E402

PROMPT = (
    "Write a Python function `running_median(xs)` that returns the median of every prefix of the "
    "list xs, with a docstring, type hints and three doctests. Think it through first."
)


def chunk_sizes(spec: str) -> list[int]:
    """`--chunk` as a cycle of sizes: "16" is every forward 16 tokens, "1,6,11,20" cycles them."""
    sizes = [int(x) for x in spec.split(",") if x.strip()]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--chunk needs positive sizes, got {spec!r}")
    return sizes


def probe(llm: LLM, tokens: int, sizes: list[int], companion: bool = False) -> dict:
    runner = llm.engine.runner
    prompt_ids = llm.tokenizer(PROMPT)["input_ids"]
    n = len(prompt_ids)
    # Prefill every slot with the same forward shape (one chunk each, separately).
    slots = (0, 1, 2) if companion else (0, 1)
    prefills = [runner.run([Chunk(slot=slot, start=0, token_ids=list(prompt_ids), num_logits=1)]) for slot in slots]
    first = int(prefills[0].argmax[0][-1])
    decode_logits, ids = [], [first]
    for step in range(tokens - 1):
        (logits,) = runner.run([Chunk(slot=0, start=n + step, token_ids=[ids[-1]], num_logits=1)]).logits
        decode_logits.append(logits[-1])
        ids.append(int(logits[-1].argmax()))
    # Slot 1 scores the same tokens in forwards of the cycled sizes; with `companion`, slot 2 decodes
    # its own copy one token per forward beside it, the shape of SSR's parent and draft child sharing
    # one batched forward (two sequences, unequal lengths).
    verify_logits, forward_size, start, turn = [], [], 0, 0
    companion_next = first
    while start < tokens - 1:
        piece = ids[start : min(start + sizes[turn % len(sizes)], tokens - 1)]
        chunks = [Chunk(slot=1, start=n + start, token_ids=piece, num_logits=len(piece))]
        if companion:
            chunks.append(Chunk(slot=2, start=n + turn, token_ids=[companion_next], num_logits=1))
        outputs = runner.run(chunks).logits
        verify_logits.extend(outputs[0])
        forward_size.extend([len(piece)] * len(piece))
        if companion:
            companion_next = int(outputs[1][-1].argmax())
        start += len(piece)
        turn += 1
    rows = []
    for position, (a, b) in enumerate(zip(decode_logits, verify_logits)):
        rows.append(
            (
                n + position,
                bool(torch.equal(a, b)),
                int(a.argmax()) == int(b.argmax()),
                float((a - b).abs().max()),
                forward_size[position],
            )
        )

    def summary(part: list) -> dict:
        return {
            "positions": len(part),
            "bitwise_equal": sum(r[1] for r in part) / max(1, len(part)),
            "argmax_agree": sum(r[2] for r in part) / max(1, len(part)),
            "max_abs_diff": max((r[3] for r in part), default=0.0),
        }

    by_split = {}
    for lo in range(0, rows[-1][0] + 1, 512):
        part = [r for r in rows if lo <= r[0] < lo + 512]
        if part:
            by_split[f"{lo}-{lo + 511}"] = summary(part)
    # Per verify-forward size: which static shape (token bucket) rounds differently from decode.
    by_size = {str(size): summary([r for r in rows if r[4] == size]) for size in sorted({r[4] for r in rows})}
    return {
        "prompt_tokens": n,
        "all": summary(rows),
        "by_position": by_split,
        "by_forward_size": by_size,
        "first_disagreement": next((r[0] for r in rows if not r[2]), None),
        "first_unequal": next((r[0] for r in rows if not r[1]), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory instead of the model's own (Gemma-3 under transformers 5.17)",
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=2400)
    parser.add_argument(
        "--chunk",
        default="16",
        help="Verify forward size, or a comma-separated cycle of sizes (e.g. 1,6,11,20,40: "
        "one per token bucket 1/8/16/32/64, the mix prompt lookup and SSR produce).",
    )
    parser.add_argument(
        "--companion",
        action="store_true",
        help="Decode a second sequence in the same forwards as the verify chunks (SSR's "
        "parent and draft child share batched forwards).",
    )
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument(
        "--token-buckets",
        default=None,
        help="Comma-separated static token buckets (default: the engine's 1,2,4,...,64). "
        "Starting at 2 pads decode steps to two tokens, so no forward has a size-1 "
        "dimension that torch.compile would specialise into a kernel of its own.",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_batch_invariance.py needs a CUDA device")
    sizes = chunk_sizes(args.chunk)
    config = EngineConfig(num_slots=3 if args.companion else 2, max_len=args.max_len)
    if args.token_buckets:
        config.graph_buckets = GraphBuckets(tokens=tuple(int(x) for x in args.token_buckets.split(",")))
    llm = LLM(args.model, device="cuda", dtype=args.dtype, engine_config=config, tokenizer=args.tokenizer)
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "tokens": args.tokens,
        "chunk": sizes,
        "companion": args.companion,
        "max_len": args.max_len,
        "token_buckets": list(config.graph_buckets.tokens),
        "device": device_name("cuda"),
        "versions": library_versions(),
        "inductor": inductor_modes(),
        "env": {k: os.environ.get(k) for k in ("SELFSPEC_INDUCTOR_DETERMINISTIC", "SELFSPEC_HOST_THREADS")},
        **probe(llm, args.tokens, sizes, args.companion),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
