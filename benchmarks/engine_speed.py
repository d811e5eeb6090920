"""Engine throughput vs transformers `generate`, same model and prompt, one run.

Prints a table of tokens/s for 1, 2, 4, 8 concurrent sequences: the engine (continuous
batching over the slot cache) and `model.generate` given the same batch (the prompt
repeated, so no padding is involved), with ratios against `generate` at the same batch and
against the engine at batch 1. Writes JSON + markdown under --out.

    python benchmarks/engine_speed.py --model smollm2 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.sampling import SamplingParams


def time_generate(model, prompt_ids: list[int], batch: int, new_tokens: int, repeats: int) -> float:
    inputs = torch.tensor([prompt_ids] * batch, device=model.device)
    mask = torch.ones_like(inputs)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                inputs,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        _sync(model)
        samples.append(time.perf_counter() - start)
        assert out.shape[1] - inputs.shape[1] == new_tokens
    return batch * new_tokens / statistics.median(samples)


def time_engine(engine: Engine, prompt_ids: list[int], batch: int, new_tokens: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        seqs = [
            engine.add_request(prompt_ids, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for _ in range(batch)
        ]
        while not all(s.is_finished for s in seqs):
            engine.step()
        _sync(engine.model)
        samples.append(time.perf_counter() - start)
        assert all(s.num_output_tokens == new_tokens for s in seqs)
    return batch * new_tokens / statistics.median(samples)


def _sync(model) -> None:
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/engine_speed")
    args = parser.parse_args()

    from selfspec.models import load_model
    from selfspec.models.thinking import ThinkingFormat, build_prompt_ids

    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    model, tok = loaded.model, loaded.tokenizer
    fmt = ThinkingFormat.detect(tok)
    prompt_ids = build_prompt_ids(tok, args.prompt, fmt, enable_thinking=False)
    batches = [int(b) for b in args.batches.split(",")]
    engine = Engine(model, tok, EngineConfig(num_slots=max(batches), max_len=len(prompt_ids) + args.new_tokens + 64))

    # Warm-up both paths once (allocator, first-call overheads).
    time_generate(model, prompt_ids, 1, 8, 1)
    time_engine(engine, prompt_ids, 1, 8, 1)

    rows = []
    for b in batches:
        gen = time_generate(model, prompt_ids, b, args.new_tokens, args.repeats)
        eng = time_engine(engine, prompt_ids, b, args.new_tokens, args.repeats)
        rows.append({"batch": b, "generate_tok_s": gen, "engine_tok_s": eng, "engine_vs_generate": eng / gen})
    base = rows[0]["engine_tok_s"]
    for r in rows:
        r["engine_vs_engine_b1"] = r["engine_tok_s"] / base

    header = "| batch | generate tok/s | engine tok/s | engine / generate | engine / engine@1 |\n|---|---|---|---|---|"
    lines = [
        f"| {r['batch']} | {r['generate_tok_s']:.1f} | {r['engine_tok_s']:.1f} | {r['engine_vs_generate']:.2f}x | {r['engine_vs_engine_b1']:.2f}x |"
        for r in rows
    ]
    meta = {
        "model": args.model,
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "dtype": args.dtype,
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt_ids),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    report = f"# Engine speed\n\n{json.dumps(meta)}\n\n{header}\n" + "\n".join(lines) + "\n"
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.device.replace(':', '_')}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out / f"{args.device.replace(':', '_')}.md").write_text(report)


if __name__ == "__main__":
    main()
