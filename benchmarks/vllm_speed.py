"""vLLM's decode speed on the shapes of `engine_speed.py`, with dummy weights: the peer our engine is measured against.

Why dummy weights: a decode step's time does not depend on the weights' values, so vLLM can
load a config alone (`load_format="dummy"`) and no model files travel to the GPU machine. The
settings are vLLM's defaults (torch.compile + CUDA graphs), what a user who runs `vllm serve`
gets; prefix caching is off so every repeat pays the same prefill.

    python benchmarks/vllm_speed.py --model qwen3-4b --batches 1,2,4,8,16,32 --new-tokens 256 \\
        --out benchmarks/engine_speed/records/h200/vllm

Each batch sends `batch` copies of the same 42-token random prompt (the one `engine_speed.py`
uses) with greedy sampling and EOS ignored; tokens/s = batch * new tokens / wall time of the
`generate` call (prefill included, as in `engine_speed.py`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def save_shape(name: str, directory: Path, dtype: str) -> Path:
    """config.json of shape `name` with its architecture named, as vLLM's loader needs."""
    from step_profile import shaped_config
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = shaped_config(name)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.torch_dtype = dtype
    config.save_pretrained(str(directory))
    return directory


def time_batches(llm, prompt_ids: list[int], batches: list[int], new_tokens: int, repeats: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, temperature=0.0, detokenize=False
    )
    out: dict[str, dict] = {}
    llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], params, use_tqdm=False)  # warm-up
    for batch in batches:
        prompts = [TokensPrompt(prompt_token_ids=list(prompt_ids)) for _ in range(batch)]
        samples = []
        for _ in range(repeats):
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            start = time.perf_counter()
            results = llm.generate(prompts, params, use_tqdm=False)
            samples.append(time.perf_counter() - start)
            assert all(len(r.outputs[0].token_ids) == new_tokens for r in results)
        median = statistics.median(samples)
        out[str(batch)] = {"seconds": samples, "tok_per_s": batch * new_tokens / median}
        print(f"vllm bs{batch}: {out[str(batch)]['tok_per_s']:.1f} tok/s", flush=True)
    return out


def render(results: dict) -> str:
    meta = results["meta"]
    rows = "\n".join(
        f"| {b} | {r['tok_per_s']:.1f} | {1e3 * statistics.median(r['seconds']) / meta['new_tokens']:.2f} |"
        for b, r in results["vllm"].items()
    )
    return (
        f"# vLLM speed: {meta['model']} (dummy weights) on {meta['device']} ({meta['dtype']})\n\n"
        f"`{meta['command']}`\n\n"
        f"vLLM {meta['vllm']}, torch {meta['torch']}, {meta['date']}; prompt {meta['prompt_tokens']} tokens, "
        f"{meta['new_tokens']} new tokens per sequence, EOS ignored, load + compile {meta['load_seconds']:.0f} s.\n\n"
        "| batch | tok/s | ms per step |\n|---|---|---|\n" + rows + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-4b", help="a shape of step_profile.SHAPES")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--enforce-eager", action="store_true", help="no torch.compile / CUDA graphs")
    parser.add_argument("--out", default="benchmarks/engine_speed/records")
    args = parser.parse_args()

    import vllm
    from vllm import LLM

    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, 1000, (42,), generator=g).tolist()  # engine_speed.py's prompt
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_shape(args.model, Path(tmp), args.dtype)
        t0 = time.perf_counter()
        llm = LLM(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=False,
            enforce_eager=args.enforce_eager,
            seed=0,
        )
        load_seconds = time.perf_counter() - t0
        batches = [int(b) for b in args.batches.split(",")]
        timings = time_batches(llm, prompt_ids, batches, args.new_tokens, args.repeats)
    results = {
        "meta": {
            "model": args.model,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "dtype": args.dtype,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "python " + " ".join(sys.argv),
            "prompt_tokens": len(prompt_ids),
            "new_tokens": args.new_tokens,
            "enforce_eager": args.enforce_eager,
            "load_seconds": load_seconds,
        },
        "vllm": timings,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"vllm_{args.model}" + ("_eager" if args.enforce_eager else "")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2))
    report = render(results)
    (out / f"{stem}.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
