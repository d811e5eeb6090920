"""Which forward shapes make bf16 lossless modes leave plain decoding's tokens — measured on this CPU.

Why: on the H200 the lossless modes once kept the bf16 baseline's tokens in 80-90% of samples, not all,
and GPU time is scarce. In bf16 on a CPU the same question has a sharper answer (every
GEMM's rounding depends on its row count), so the engine's shape choices can be tested here: the
same samples and modes under engine configurations that fix more and more of the forward's shape.

    python benchmarks/exactness/cpu_bf16_exactness.py --out /tmp/cpu_bf16_exactness   # ~10 min on 2 cores

(writes results.json and table.md; the committed results.json is
benchmarks/exactness/records/cpu/bf16_forward_shapes_humaneval.json)

Configurations (SmolLM2-135M-Instruct, bf16, HumanEval samples, the paper row's shape at small caps):
- `eager`: the CPU engine's default (each forward as long as its chunk);
- `tokens16`: static forwards with token buckets (16, 64): decode and every verify of <= 16 tokens in
  one shape, key lengths still bucketed (128, 256, ...);
- `tokens16+keys`: the same with one key length for every forward (the cache length).
Per configuration and sample: where each mode first leaves the baseline (None: never), and the
forward shapes behind the first differing token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from selfspec.engine.llm_engine import EngineConfig  # noqa: E402
from selfspec.engine.static_forward import GraphBuckets  # noqa: E402
from selfspec.llm import LLM  # noqa: E402
from selfspec.run_info import device_name, library_versions  # noqa: E402
from selfspec.spec.suffix import SuffixOptions  # noqa: E402
from selfspec_bench.datasets import load_benchmark  # noqa: E402
from selfspec_bench.modes import BenchSettings, spec_for  # noqa: E402
from selfspec_bench.runner import _limits, _params, divergence_fields  # noqa: E402

MODES = ("prefix+suffix", "suffix-decoding", "prompt-lookup")


def engine_config(name: str, max_len: int) -> EngineConfig:
    if name == "eager":
        return EngineConfig(num_slots=4, max_len=max_len, clamp_max_len=True)
    min_keys = max_len if name == "tokens16+keys" else 128
    return EngineConfig(
        num_slots=4,
        max_len=max_len,
        clamp_max_len=True,
        static_shapes=True,
        graph_buckets=GraphBuckets(tokens=(16, 64), min_keys=min_keys),
    )


def run(config_name: str, samples, settings: BenchSettings, max_len: int) -> list[dict]:
    llm = LLM("smollm2", device="cpu", dtype="bfloat16", engine_config=engine_config(config_name, max_len))
    rows = []
    for sample in samples:
        (base,) = llm.generate([sample.messages], _params(settings), limits=_limits(settings), thinking=True, spec=None)
        for mode in MODES:
            (r,) = llm.generate(
                [sample.messages],
                _params(settings),
                spec=spec_for(mode, settings),
                limits=_limits(settings),
                thinking=True,
            )
            fields = divergence_fields(
                list(base.token_ids),
                base.metrics.get("cot_tokens", 0),
                list(r.token_ids),
                list(base.output_shapes),
                list(r.output_shapes),
            )
            rows.append({"config": config_name, "sample_id": sample.id, "mode": mode, **fields})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--configs", default="eager,tokens16,tokens16+keys")
    parser.add_argument("--out", default="/tmp/cpu_bf16_exactness")
    args = parser.parse_args()
    torch.set_num_threads(2)
    settings = BenchSettings(
        cot_cap=200,
        answer_cap=100,
        draft_budget=60,
        draft_interval=None,
        max_draft_len=100,
        fixed_length=True,
        suffix=SuffixOptions(max_depth=4, max_spec_tokens=16, spec_factor=4.0),
        suffix_sources=["draft"],
        suffix_backoff_max=16,
        seed=0,
        concurrency=1,
    )
    samples = load_benchmark("humaneval", limit=args.samples)
    max_len = 512
    start = time.time()
    rows = [row for name in args.configs.split(",") for row in run(name, samples, settings, max_len)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": "smollm2",
        "dtype": "bfloat16",
        "device": device_name("cpu"),
        "versions": library_versions(),
        "date": time.strftime("%Y-%m-%d"),
        "settings": settings.to_dict(),
        "max_len": max_len,
        "seconds": round(time.time() - start, 1),
        "runs": rows,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    lines = ["| configuration | sample | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES)]
    for name in args.configs.split(","):
        for sample in samples:
            cells = []
            for mode in MODES:
                row = next(r for r in rows if r["config"] == name and r["sample_id"] == sample.id and r["mode"] == mode)
                index = row["first_divergence"]
                cells.append(
                    "exact"
                    if index is None
                    else f"leaves at {index} ({row.get('first_divergence_shape', '?')} vs {row.get('baseline_shape_at_divergence', '?')})"
                )
            lines.append(f"| {name} | {sample.id} | " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
