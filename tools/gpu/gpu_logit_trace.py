"""Where does a lossless mode's run first compute other bits than the baseline's? (GPU diagnosis)

On the H200 (bf16, SmolLM2) the probe (`gpu_batch_invariance.py`) found every forward shape —
token buckets 1 to 64, a second sequence in the batch — bitwise equal to a one-token decode step
over 6,000 positions, and three token-bucket layouts gave every run the same tokens; yet in
HumanEval/42, 90, 96 and 104 prefix+suffix, suffix decoding and prompt lookup all left the
baseline at the same token and then agreed with each other for thousands of tokens. The shapes that
chose the diverging token are the same in both runs, so the two runs must hold different state
before it. This finds that state: it runs one benchmark sample through several modes with the
bench's own settings and warm-up (e.g. `baseline,suffix-decoding,baseline`), and records for the
request's own KV slot

- a fingerprint of every logits row scored on the true context (its position and forward shape),
- after the run, a fingerprint of every position's keys and values, per layer,
- which forward (shape) last wrote each position's K/V,

then reports each run against the first: the first token that differs, the first position whose
logits differ (both forwards' shapes, the baseline's top-2 margin there), the first position whose
K/V differ (layer, writers), and positions one run scored twice with different bits.

    python tools/gpu/gpu_logit_trace.py --model smollm2 --benchmark humaneval --id HumanEval/42 \\
        --runs baseline,suffix-decoding,prefix+suffix,baseline --max-len 3980 --out trace.json

On the CPU with every step in one static shape every comparison comes out equal, in fp32 (tests/tools/test_logit_trace.py)
and in bf16 over the paper row's 3,505 tokens (benchmarks/exactness/README.md). What it found on the H200
(the slot-attention kernel's split merge) and the traces after the fix: benchmarks/exactness/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from selfspec.run_info import device_name, library_versions  # noqa: E402
from selfspec_bench.datasets import load_benchmark  # noqa: E402
from selfspec_bench.modes import PAPER_ANSWER_CAPS, BenchSettings  # noqa: E402
from selfspec_bench.runner import _warm_up, run_engine_mode  # noqa: E402

_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """Fixed pseudo-random int64 weights < 2**12: a weighted sum of a row's bit patterns is an
    exact fingerprint (no overflow for rows up to 2**19 elements of 32-bit patterns)."""
    key = (n, str(device))
    if key not in _WEIGHTS:
        g = torch.Generator().manual_seed(1234 + n)
        _WEIGHTS[key] = torch.randint(1, 1 << 12, (n,), generator=g, dtype=torch.int64).to(device)
    return _WEIGHTS[key]


def fingerprint(x: torch.Tensor) -> torch.Tensor:
    """[..., N] float tensor -> [...] int64: equal iff (almost surely) the bits are equal."""
    x = x.contiguous()
    bits = {4: torch.int32, 2: torch.int16}[x.element_size()]
    return (x.view(bits).to(torch.int64) * _weights(x.shape[-1], x.device)).sum(-1)


@dataclass
class Row:
    position: int  # the logits at this position choose the token at position + 1
    fp: int
    label: str
    top1: int
    gap: float  # top-1 minus top-2 logit


@dataclass
class RunTrace:
    mode: str
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    prompt_len: int = 0
    rows: list[tuple[int, int, list[int], str, list[int], list[int], list[float]]] = field(default_factory=list)
    writes: list[tuple[int, int, list[int], str]] = field(default_factory=list)
    kv: tuple[torch.Tensor, torch.Tensor] | None = None  # [layers, positions] fingerprints of K and V

    def valid(self, start: int, chunk: list[int], upto: int) -> bool:
        """Whether a chunk fed at `start` carried the final tokens up to position `upto`."""
        n = upto - start + 1
        return 0 < n <= len(chunk) and self.tokens[start : upto + 1] == chunk[:n]

    def true_rows(self) -> dict[int, list[Row]]:
        out: dict[int, list[Row]] = {}
        for slot, start, chunk, label, fps, top1, gaps in self.rows:
            if slot != self.slot:
                continue
            first = start + len(chunk) - len(fps)
            for r, fp in enumerate(fps):
                q = first + r
                if self.valid(start, chunk, q):
                    out.setdefault(q, []).append(Row(q, fp, label, top1[r], gaps[r]))
        return out

    def writers(self) -> dict[int, tuple[str, bool]]:
        """Position -> (shape of the last forward that wrote its K/V, whether that forward fed the final tokens)."""
        out: dict[int, tuple[str, bool]] = {}
        for slot, start, chunk, label in self.writes:
            if slot != self.slot:
                continue
            for j in range(len(chunk)):
                out[start + j] = (label, self.valid(start, chunk, start + j))
        return out


class Tracer:
    """Wraps the engine's runner while a run lasts: logits rows and K/V writes, per slot."""

    def __init__(self, llm) -> None:
        self.llm = llm

    @contextlib.contextmanager
    def recording(self, trace: RunTrace):
        engine, runner = self.llm.engine, self.llm.engine.runner
        run, copy_slot, add_request = runner.run, runner.copy_slot, engine.add_request
        first: list = []

        def traced_run(chunks, want_logits=None, look_ahead=False):
            # Every row's logits, so no step decodes ahead (`engine.decode_ahead` skips steps that read logits).
            forward = run(chunks, [True] * len(chunks))
            if first and first[0].slot is not None:
                trace.slot = first[0].slot  # the request's slot (released, set to None, at its end)
            for chunk, logits, label in zip(chunks, forward.logits, forward.shapes):
                trace.writes.append((chunk.slot, chunk.start, list(chunk.token_ids), label))
                if logits is None:
                    continue
                top = logits.topk(2, dim=-1).values
                trace.rows.append(
                    (
                        chunk.slot,
                        chunk.start,
                        list(chunk.token_ids),
                        label,
                        fingerprint(logits).tolist(),
                        logits.argmax(-1).tolist(),
                        (top[:, 0] - top[:, 1]).tolist(),
                    )
                )
            if want_logits is not None:  # hand the engine what it asked for
                forward.logits[:] = [r if w else None for r, w in zip(forward.logits, want_logits)]
            return forward

        def traced_copy(src, dst, length):
            copy_slot(src, dst, length)
            # A copy into a slot is a write of every position it covers (positions from another slot).
            trace.writes.append((dst, 0, [-1] * length, f"copy from slot {src}"))

        def traced_add(*args, **kwargs):
            seq = add_request(*args, **kwargs)
            first.append(seq)
            return seq

        runner.run, runner.copy_slot, engine.add_request = traced_run, traced_copy, traced_add
        try:
            yield
        finally:
            runner.run, runner.copy_slot, engine.add_request = run, copy_slot, add_request
        parent = first[0]
        trace.tokens, trace.prompt_len = list(parent.token_ids), parent.prompt_len
        # Positions with K/V written: all but the last token (fed next, never).
        length = len(trace.tokens) - 1
        cache = runner.cache
        with torch.inference_mode():
            kf = torch.stack(
                [fingerprint(k[trace.slot, :, :length].transpose(0, 1).reshape(length, -1)) for k in cache.keys]
            )
            vf = torch.stack(
                [fingerprint(v[trace.slot, :, :length].transpose(0, 1).reshape(length, -1)) for v in cache.values]
            )
        trace.kv = (kf.cpu(), vf.cpu())


def compare(base: RunTrace, other: RunTrace) -> dict:
    """Where `other` first computes other bits than `base`: tokens, logits, K/V.

    Only positions whose context is the same tokens in both runs count. A logits difference's
    `output_index` is the output token those logits choose; a K/V difference's is the output token
    whose keys and values differ (negative: a prompt position).
    """
    n = min(len(base.tokens), len(other.tokens))
    token_div = next((i for i in range(n) if base.tokens[i] != other.tokens[i]), None)
    same_until = token_div if token_div is not None else n  # positions < this hold the same tokens
    rows_a, rows_b = base.true_rows(), other.true_rows()
    first_logits = None
    for q in sorted(set(rows_a) & set(rows_b)):
        if q + 1 > same_until:  # the context (positions <= q) must be the same tokens
            break
        a, b = rows_a[q][-1], rows_b[q][-1]
        if a.fp != b.fp:
            first_logits = {
                "position": q,
                "output_index": q + 1 - base.prompt_len,
                "base_shape": a.label,
                "other_shape": b.label,
                "base_top1": a.top1,
                "other_top1": b.top1,
                "base_gap": a.gap,
                "other_gap": b.gap,
                "argmax_differs": a.top1 != b.top1,
            }
            break
    first_kv = None
    writers_a, writers_b = base.writers(), other.writers()
    limit = min(same_until, base.kv[0].shape[1], other.kv[0].shape[1])
    if limit > 0:
        k_diff = base.kv[0][:, :limit] != other.kv[0][:, :limit]
        v_diff = base.kv[1][:, :limit] != other.kv[1][:, :limit]
        any_pos = (k_diff | v_diff).any(0).nonzero()
        if len(any_pos):
            p = int(any_pos[0])
            layers = (k_diff[:, p] | v_diff[:, p]).nonzero().flatten().tolist()
            first_kv = {
                "position": p,
                "output_index": p - base.prompt_len,
                "first_layer": layers[0],
                "layers": len(layers),
                "keys_differ": bool(k_diff[:, p].any()),
                "values_differ": bool(v_diff[:, p].any()),
                "base_writer": writers_a.get(p),
                "other_writer": writers_b.get(p),
                "positions_differing": int((k_diff | v_diff).any(0).sum()),
            }
    return {
        "mode": other.mode,
        "token_divergence": None if token_div is None else token_div - base.prompt_len,
        "first_logits_difference": first_logits,
        "first_kv_difference": first_kv,
    }


def self_inconsistency(trace: RunTrace) -> dict | None:
    """The first position this run scored twice, on the true context, with different bits."""
    for q, rows in sorted(trace.true_rows().items()):
        fps = {r.fp for r in rows}
        if len(fps) > 1:
            return {"position": q, "output_index": q + 1 - trace.prompt_len, "shapes": [r.label for r in rows]}
    return None


def trace_runs(llm, sample, runs: list[str], settings: BenchSettings, warm_up: bool = True) -> dict:
    if warm_up:
        _warm_up(llm, [sample], settings, sorted(set(runs)))
    tracer = Tracer(llm)
    traces, records = [], []
    for mode in runs:
        trace = RunTrace(mode)
        static = llm.engine.runner.static
        shapes_before = len(static.forwards) if static is not None else 0
        with tracer.recording(trace):
            record = run_engine_mode(llm, sample, mode, settings)
        traces.append(trace)
        records.append(
            {
                "mode": mode,
                "latency_s": record["latency_s"],
                "output_hash": record["output_hash"],
                "slot": trace.slot,
                "forward_shapes": record["forward_shapes"],
                # torch.compile graphs built during the run: eager forwards (prefill, long verify
                # chunks) call the compiled twins, and a new compilation mid-process could give a
                # later run of the same shape another kernel than an earlier one.
                "new_compiled_graphs": record["compiled_graphs"],
                # static forwards (CUDA graphs) built during the run: shapes the warm-up missed
                "new_static_shapes": (len(static.forwards) if static is not None else 0) - shapes_before,
                "self_inconsistency": self_inconsistency(trace),
            }
        )
    return {"sample_id": sample.id, "runs": records, "against_first": [compare(traces[0], t) for t in traces[1:]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory instead of the model's own (Gemma-3 under transformers 5.17)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--benchmark", default="humaneval")
    parser.add_argument("--id", action="append", required=True, help="Sample id (repeatable).")
    parser.add_argument(
        "--runs",
        default="baseline,suffix-decoding,prefix+suffix,prompt-lookup,baseline",
        help="Modes run in this order on one engine; each is compared with the first.",
    )
    parser.add_argument("--max-len", type=int, default=None)
    parser.add_argument("--cot-cap", type=int, default=2000)
    parser.add_argument("--answer-cap", type=int, default=None)
    parser.add_argument("--draft-budget", type=int, default=500)
    parser.add_argument("--num-slots", type=int, default=4)
    parser.add_argument(
        "--token-buckets",
        default=None,
        help="Static forwards' token buckets (as bench --token-buckets; on a CPU it also puts the engine "
        "on the static path).",
    )
    parser.add_argument(
        "--min-keys",
        type=int,
        default=128,
        help="Smallest key bucket; the engine's length gives every forward one key length.",
    )
    # Which engine component makes runs part (bisection on the GPU): each off in turn.
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-cuda-graphs: static forwards run without capture (same buckets).",
    )
    parser.add_argument(
        "--compile-pointwise",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-compile-pointwise: norms, MLP activation and rotary uncompiled.",
    )
    parser.add_argument(
        "--slot-attention",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--no-slot-attention: static forwards gather keys and run SDPA instead of the Triton kernel.",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from selfspec.engine.llm_engine import EngineConfig
    from selfspec.engine.sizing import model_context_length
    from selfspec.llm import LLM
    from selfspec.models import load_model
    from selfspec_bench.context_fit import fit_to_context

    family = args.benchmark.split("/")[0]
    settings = BenchSettings(
        cot_cap=args.cot_cap,
        answer_cap=args.answer_cap or PAPER_ANSWER_CAPS.get(family, 1500),
        draft_budget=args.draft_budget,
        max_draft_len=args.draft_budget,
    )
    everything = load_benchmark(args.benchmark)
    samples = [s for s in everything if s.id in set(args.id)]
    if len(samples) != len(set(args.id)):
        sys.exit(f"unknown ids: {sorted(set(args.id) - {s.id for s in samples})}")
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer)
    fit = fit_to_context(
        samples,
        loaded.tokenizer,
        loaded.thinking,
        model_context_length(loaded.model.config),
        settings.cot_cap,
        settings.answer_cap,
    )
    from selfspec.engine.static_forward import GraphBuckets

    tokens = tuple(int(x) for x in args.token_buckets.split(",")) if args.token_buckets else GraphBuckets().tokens
    config = EngineConfig(
        num_slots=args.num_slots,
        max_len=args.max_len or fit.max_len,
        clamp_max_len=True,
        graph_buckets=GraphBuckets(tokens=tokens, min_keys=args.min_keys),
        static_shapes=args.token_buckets is not None or args.cuda_graphs is False,
        cuda_graphs=args.cuda_graphs,
        compile_pointwise=args.compile_pointwise,
        slot_attention=args.slot_attention,
    )
    llm = LLM.from_loaded(loaded, engine_config=config)
    runner = llm.engine.runner
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "token_buckets": list(tokens),
        "min_keys": args.min_keys,
        "engine": {
            "cuda_graphs": bool(runner.static is not None and runner.static.capture),
            "static_shapes": runner.static is not None,
            "compile_pointwise": bool(runner.fused_pointwise),
            "slot_attention": bool(runner.slot_attention),
        },
        "device": device_name(args.device),
        "versions": library_versions(),
        "engine_max_len": llm.engine.max_len,
        "settings": settings.to_dict(),
        "date": time.strftime("%Y-%m-%d"),
        "samples": [],
    }
    for i, sample in enumerate(samples):
        result["samples"].append(trace_runs(llm, sample, args.runs.split(","), settings, warm_up=i == 0))
        print(json.dumps(result["samples"][-1], indent=1), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
