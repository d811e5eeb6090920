"""`selfspec bench --backend vllm`: the same samples and modes on the pinned vLLM.

Two engines of the same vLLM are built: one without a speculative config (the baseline:
vLLM's own plain decoding) and one with SSR's proposer. Modes are interleaved per sample
as in the engine runner, each sample's modes compared with its baseline's tokens. A record
carries latency, answer tokens and the answer request's target forwards (vLLM steps that
carried it), so forwards per answer token is what speculation saved in target passes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from selfspec_bench.modes import BenchSettings, spec_for
from selfspec_bench.runner import _limits, _params, token_hash

VLLM_MODES = ("baseline", "prefix", "suffix", "prefix+suffix", "iterative")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run_vllm_bench(
    model: str,
    samples: Sequence[Any],
    modes: Sequence[str],
    settings: BenchSettings,
    out: Path,
    *,
    meta: dict[str, Any],
    engine_args: dict[str, Any] | None = None,
    num_speculative_tokens: int = 16,
) -> list[dict[str, Any]]:
    """Run `modes` on every sample (one request at a time) and append JSONL records to `out`."""
    unknown = [m for m in modes if m not in VLLM_MODES]
    if unknown:
        raise ValueError(f"modes {unknown} do not run on the vLLM backend; choose from {', '.join(VLLM_MODES)}")
    from selfspec.integrations.vllm.engine import VLLMEngine

    args = {
        "dtype": "float32",
        "enforce_eager": True,
        "max_num_seqs": 8,
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 1 << 29,
        # CUDA vLLM checks that this fraction of the GPU is free at start: the two engines share it.
        **({"gpu_memory_utilization": 0.3} if _cuda() else {}),
        **(engine_args or {}),
    }
    base = VLLMEngine(model, speculation=False, **args)
    ssr = VLLMEngine(model, speculation=True, num_speculative_tokens=num_speculative_tokens, **args)
    meta = {**meta, "backend": "vllm", "vllm": ssr.vllm_version, "num_speculative_tokens": num_speculative_tokens}
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    warm = samples[0].messages
    for engine in (base, ssr):  # untimed: first-call costs (tokenizer, allocator) out of the first record
        engine.generate([warm], _params(settings), limits=_limits(settings), thinking=True)
    with out.open("a") as fh:
        for sample in samples:
            baseline_hash = None
            for mode in modes:
                engine = base if mode == "baseline" else ssr
                spec = spec_for(mode, settings)
                start = time.perf_counter()
                (r,) = engine.generate(
                    [sample.messages], _params(settings), limits=_limits(settings), spec=spec, thinking=True
                )
                latency = time.perf_counter() - start
                record = {
                    "sample_id": sample.id,
                    "mode": mode,
                    "latency": latency,
                    "answer_latency": r.timings.answer,
                    "output_hash": token_hash(r.token_ids),
                    "cot_tokens": r.metrics["cot_tokens"],
                    "answer_tokens": r.metrics["answer_tokens"],
                    "answer_forwards": r.metrics["answer_forwards"],
                    "forwards_per_answer_token": r.metrics["answer_forwards"] / max(1, r.metrics["answer_tokens"]),
                    "metrics": r.metrics,
                    "settings": settings.to_dict(),
                    **meta,
                }
                if mode == "baseline":
                    baseline_hash = record["output_hash"]
                record["exact"] = None if baseline_hash is None else record["output_hash"] == baseline_hash
                fh.write(json.dumps(record) + "\n")
                records.append(record)
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: mean latency, speedup against the baseline, forwards per answer token, exactness."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_mode.setdefault(r["mode"], []).append(r)
    base = by_mode.get("baseline", [])
    base_latency = sum(r["latency"] for r in base) / len(base) if base else None
    table = {}
    for mode, rs in by_mode.items():
        latency = sum(r["latency"] for r in rs) / len(rs)
        answer = sum(r["answer_tokens"] for r in rs)
        table[mode] = {
            "samples": len(rs),
            "mean_latency_s": round(latency, 4),
            "speedup": None if not base_latency else round(base_latency / latency, 3),
            "forwards_per_answer_token": round(sum(r["answer_forwards"] for r in rs) / max(1, answer), 3),
            "accepted_prefix": sum(r["metrics"].get("accepted_prefix", 0) for r in rs),
            "suffix_accepted_tokens": sum(r["metrics"].get("suffix_accepted_tokens", 0) for r in rs),
            "exact": all(r["exact"] is not False for r in rs),
        }
    return table
