"""What one CoSpec arbitration costs next to the target's verify forward of the same round.

CoSpec asks its arbitrator at nearly every verification round, on the critical path, so the
method can only be as fast as SpS if a decision costs a fraction of the round's target verify
forward (the paper's premise; our target: at most 25%). This runs the same held-out items in
one process: target alone, SpS at K, and CoSpec at a threshold above 1 (nothing kept: the
output is exactly SpS's, so every CoSpec mode walks the same rounds and asks the arbitrator at
the same mismatches) with the arbitrator's two prefix windows:

* `sliding`  — the last `max_prefix_tokens` tokens: a full forward over window + blocks per decision;
* `anchored` — the window moves in steps of `reanchor_tokens`, so its K/V are cached and a
  decision feeds only the prefix's new tokens and the two blocks (`cospec.prefix_cache`);
  requests at a mismatch in the same step share one call;
* `anchored-alone` — the same, each request deciding alone (what batching saves).

Reported per mode: mean latency per item and its ratio to target-only and to SpS, tokens/s,
arbitrations, arbitrator calls (with `--concurrency C` > 1 the requests deciding in one step
share one call), milliseconds per call, the median verify forward of C rows x (K + 1) tokens
from the engine's own step timings (`engine.step_costs`, which exclude the arbitration), and
their ratio.
Every mode's tokens are checked against SpS's (all exact by construction).

Run: python benchmarks/cospec/arbitration_cost.py --device cpu --dtype float32 \\
         --out-dir benchmarks/cospec/records/cpu/arbitration_cost
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.progress import Progress

from selfspec import CoSpecConfig, DraftModelConfig, SamplingParams
from selfspec.cli.command_line import auto_device_and_dtype
from selfspec.engine.step_costs import StepCosts
from selfspec.run_info import device_name, library_versions, source_hash
from selfspec.server.cli import load_llm
from selfspec.spec.cospec.checkpoint import load_arbitrator_for, read_checkpoint_config
from selfspec.spec.cospec.prefix_cache import prefix_cache_stats
from selfspec_research.cospec.eval_config import NEVER_KEEP
from selfspec_research.cospec.eval_tasks import thinker_task

MODES = ("target", "sps", "cospec-sliding", "cospec-anchored", "cospec-anchored-alone")


def spec_for(mode: str, args: argparse.Namespace, arbitrator) -> object | None:
    if mode == "target":
        return None
    if mode == "sps":
        return DraftModelConfig(num_speculative_tokens=args.k)
    return CoSpecConfig(
        num_speculative_tokens=args.k,
        threshold=NEVER_KEEP,
        arbitrator=arbitrator,
        max_prefix_tokens=args.max_prefix_tokens,
        reanchor_tokens=args.reanchor_tokens,
        prefix_window="sliding" if mode == "cospec-sliding" else "anchored",
        batch_arbitration=mode == "cospec-anchored",
    )


def groups_of(items, size: int) -> list[list]:
    """Consecutive items in groups of `size` (a group decodes together), tasks mixed where they
    share a thinking setting (a call has one). Grouped by task instead, 8 items of each of two
    tasks at `size` 16 ran as two groups of 8: a load of 8 reported as 16."""
    groups: list[list] = []
    for task, item in items:
        if groups and len(groups[-1]) < size and groups[-1][0][0].thinking == task.thinking:
            groups[-1].append((task, item))
        else:
            groups.append([(task, item)])
    return groups


def run_mode(llm, mode: str, items, args, arbitrator, progress, bar) -> dict:
    """The items in groups of `--concurrency` requests decoding together (one at a time by
    default), in one mode, after one untimed warm-up group."""
    params = SamplingParams(max_tokens=args.max_tokens)
    warm = SamplingParams(max_tokens=min(32, args.max_tokens))
    groups = groups_of(items, args.concurrency)
    spec = spec_for(mode, args, arbitrator)
    llm.generate([item.messages for _, item in groups[0]], warm, spec=spec, thinking=groups[0][0][0].thinking)
    llm.engine.step_costs = StepCosts()  # this mode's forwards only
    cache_before = prefix_cache_stats(arbitrator) if mode.startswith("cospec-anchored") else None
    latencies, walls, tokens, arbitrations, arbitration_s = [], [], [], 0, 0.0
    for group in groups:
        started = time.perf_counter()
        outs = llm.generate([item.messages for _, item in group], params, spec=spec, thinking=group[0][0].thinking)
        walls.append(time.perf_counter() - started)
        for out in outs:
            latencies.append(out.timings.total)
            tokens.append(list(out.token_ids))
            arbitrations += int(out.metrics.get("arbitrations", 0))
            arbitration_s += float(out.metrics.get("arbitration_s", 0.0))
            progress.advance(bar)
    rows = args.concurrency
    verify = llm.engine.step_costs.seconds(rows, args.k + 1, min_samples=1)
    decode = llm.engine.step_costs.seconds(1, 1, min_samples=1)
    per_arbitration = arbitration_s / arbitrations if arbitrations else None
    cache = prefix_cache_stats(arbitrator) if mode.startswith("cospec-anchored") else None
    calls = None if cache is None else cache["calls"] - (cache_before["calls"] if cache_before else 0)
    per_call = arbitration_s / calls if calls else None
    return {
        "mode": mode,
        "items": len(items),
        "concurrency": rows,
        "mean_latency_s": statistics.fmean(latencies),
        "latencies_s": latencies,
        "wall_s": sum(walls),
        "tokens_per_s": sum(map(len, tokens)) / sum(walls),
        "generated_tokens": sum(map(len, tokens)),
        "arbitrations": arbitrations,
        # Decisions of requests deciding in the same step share one call (`prepare_verify_many`).
        "arbitrator_calls": calls,
        "arbitration_ms": None if per_arbitration is None else 1000 * per_arbitration,
        "arbitration_call_ms": None if per_call is None else 1000 * per_call,
        "verify_forward_ms": None if verify is None else 1000 * verify,
        "verify_rows": rows,
        "decode_step_ms": None if decode is None else 1000 * decode,
        "arbitration_over_verify": None if per_call is None or not verify else per_call / verify,
        "step_costs_ms_per_token": llm.engine.step_costs.summary(),
        # Whether the cached decisions ran as CUDA graphs (and which buckets), rebuilds, fed tokens.
        "prefix_cache": cache,
        "tokens": tokens,
    }


def markdown(summary: dict) -> str:
    meta = summary["meta"]
    lines = [
        "# CoSpec: one arbitration against the target's verify forward",
        "",
        f"- command: `{meta['command']}`",
        f"- device: {meta['device']}; dtype {meta['dtype']}; torch {meta['versions'].get('torch')}, "
        f"transformers {meta['versions'].get('transformers')}; date {meta['date']}",
        f"- model {meta['model']}, draft {meta['draft']}, arbitrator {meta['arbitrator']}; K = {meta['k']}; "
        f"window {meta['max_prefix_tokens']} tokens (anchored: moves by {meta['reanchor_tokens']})",
        f"- items: {meta['items']} ({', '.join(meta['tasks'])}, seed {meta['seed']}), up to {meta['max_tokens']} tokens"
        f" each, {_together(meta.get('concurrency', 1))}; CoSpec at λ = {NEVER_KEEP} keeps nothing, so every"
        " mode's tokens equal SpS's:"
        f" {'yes' if summary['exact'] else 'NO'}",
        "",
        "| mode | mean latency (s) | vs target | vs SpS | tokens/s | arbitrations | arbitrator calls |"
        " ms / call | verify fwd (ms) | call / verify |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = {r["mode"]: r for r in summary["modes"]}
    for r in summary["modes"]:

        def fmt(v, spec=".3f"):
            return "-" if v is None else format(v, spec)

        lines.append(
            f"| {r['mode']} | {r['mean_latency_s']:.3f} | {rows['target']['mean_latency_s'] / r['mean_latency_s']:.3f}x"
            f" | {rows['sps']['mean_latency_s'] / r['mean_latency_s']:.3f}x | {fmt(r.get('tokens_per_s'), '.1f')} |"
            f" {r['arbitrations']} | {fmt(r.get('arbitrator_calls'), 'd')} |"
            f" {fmt(r.get('arbitration_call_ms', r['arbitration_ms']), '.2f')} | {fmt(r['verify_forward_ms'], '.2f')} |"
            f" {fmt(r['arbitration_over_verify'], '.1%')} |"
        )
    return "\n".join(lines) + "\n"


def _together(concurrency: int) -> str:
    if concurrency == 1:
        return "one request at a time"
    return f"{concurrency} requests decoding together (verify fwd: a step of {concurrency} rows)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-thinker")
    parser.add_argument("--arbitrator", default="benchmarks/cospec/arbitrator")
    parser.add_argument("--draft", default=None, help="default: the checkpoint's draft")
    parser.add_argument("--tasks", default="class_synthesis,route_finding")
    parser.add_argument("--n", type=int, default=2, help="items per task")
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--max-prefix-tokens", type=int, default=512)
    parser.add_argument("--reanchor-tokens", type=int, default=128)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--concurrency", type=int, default=1, help="requests decoding together")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    if "target" not in modes or "sps" not in modes:
        parser.error("the ratios need the target and sps modes")
    device, dtype = auto_device_and_dtype(args.device, args.dtype)
    checkpoint = read_checkpoint_config(args.arbitrator)
    draft = args.draft or checkpoint.draft
    if args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    slots = max(4, args.concurrency)
    llm = load_llm(args.model, device=device, dtype=dtype, num_slots=slots, max_len=4096, draft=draft)
    arbitrator = load_arbitrator_for(llm, args.arbitrator)
    tasks = [thinker_task(name, args.n, args.seed) for name in args.tasks.split(",")]
    items = [(task, item) for task in tasks for item in task.items]
    results = []
    with Progress() as progress:
        bar = progress.add_task("modes x items", total=len(modes) * len(items))
        for mode in modes:
            results.append(run_mode(llm, mode, items, args, arbitrator, progress, bar))
    sps_tokens = next(r["tokens"] for r in results if r["mode"] == "sps")
    exact = all(r["tokens"] == sps_tokens for r in results if r["mode"] != "target")
    for r in results:
        r.pop("tokens")
    meta = {
        "command": "python benchmarks/cospec/arbitration_cost.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "device": device_name(device)
        if device != "cpu"
        else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "dtype": dtype,
        "versions": library_versions(),
        "source": source_hash(),
        "date": dt.date.today().isoformat(),
        "model": args.model,
        "draft": draft,
        "arbitrator": args.arbitrator,
        "k": args.k,
        "max_prefix_tokens": args.max_prefix_tokens,
        "reanchor_tokens": args.reanchor_tokens,
        "items": len(items),
        "tasks": args.tasks.split(","),
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
    }
    summary = {"meta": meta, "exact": exact, "modes": results}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out_dir / "README.md").write_text(markdown(summary))
    print(markdown(summary))


if __name__ == "__main__":
    main()
