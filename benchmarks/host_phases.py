"""Where a speculation mode's host time per engine step goes, by the request's phase and rows.

Why: on a GPU a small model's forward is ~1.5 ms, and the default policy (`auto`) has trailed
prompt lookup in the chain of thought by the host time around its forwards, not by the forwards
(`benchmarks/thinker/README.md`). The bench records carry the host's part of a step per phase and
per rows fed, summed over a whole request; this splits it further by the parent's phase when the
step ran (chain of thought or answer), so a change to one mode's per-step work can be measured
on this machine before a GPU block, against the modes beside it on the same items.

It drives the engine step by step (no hook in the engine): before each step it notes the
request's phase, after it the change in `engine.host_phases` (propose: scheduling and proposals;
commit: verification and commits; policies: the methods' bookkeeping, forks) and which rows
group the step fell in. Each mode runs `--repeats` times per item, the first as a warm-up; every
mode's tokens are checked against the first mode's.

    OMP_NUM_THREADS=2 python benchmarks/host_phases.py --modes prompt-lookup,ssr+lookup,auto \\
        --offset 64 --out benchmarks/thinker/records/cpu/host_phases

Writes `host_phases.json` (per mode, phase and rows group: steps, median and mean µs per phase,
median step ms) and `host_phases.md` (command, device, versions, date, the table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from selfspec.llm import LLM
from selfspec.run_info import device_name
from selfspec_bench.datasets import load_benchmark
from selfspec_bench.modes import BenchSettings, spec_for
from selfspec_bench.runner import _limits, _params

PARTS = ("propose", "commit", "policies")


def _phase(seq) -> str:
    """The request's phase before a step: the thinking policy's, "-" for a plain request."""
    phase = getattr(getattr(seq, "policy", None), "phase", None)
    return "-" if phase is None else str(getattr(phase, "name", phase)).lower()


def run_mode(llm: LLM, sample, mode: str, settings: BenchSettings) -> tuple[list[tuple], list[int], float]:
    """One request of `mode` driven step by step: per step (phase, rows group, propose, commit,
    policies seconds, step seconds); the output tokens; the latency."""
    engine, phases = llm.engine, llm.engine.host_phases
    phases.reset()
    began = time.perf_counter()
    seq = llm.submit(
        sample.messages, _params(settings), spec=spec_for(mode, settings), limits=_limits(settings), thinking=True
    )
    steps: list[tuple] = []
    while not seq.is_finished:
        phase = _phase(seq)
        before = dict(phases.seconds)
        rows_before = {group: values.get("steps", 0) for group, values in phases.by_rows().items()}
        t0 = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t0
        rows_after = {group: values.get("steps", 0) for group, values in phases.by_rows().items()}
        grown = [group for group, n in rows_after.items() if n > rows_before.get(group, 0)]
        if not grown:  # nothing was fed this step
            continue
        steps.append((phase, grown[0], *(phases.seconds[p] - before[p] for p in PARTS), wall))
    latency = time.perf_counter() - began
    return steps, list(llm.result(seq).token_ids), latency


def summarise(steps: list[tuple]) -> dict[str, dict]:
    """Per "phase/rows": steps, median and mean µs per part, median step ms."""
    out: dict[str, dict] = {}
    for key in sorted({(s[0], s[1]) for s in steps}):
        chosen = [s for s in steps if (s[0], s[1]) == key]
        entry: dict = {"steps": len(chosen)}
        for i, part in enumerate(PARTS, start=2):
            values = [s[i] * 1e6 for s in chosen]
            entry[f"{part}_median_us"] = round(statistics.median(values), 1)
            entry[f"{part}_mean_us"] = round(statistics.fmean(values), 1)
        entry["step_median_ms"] = round(statistics.median(s[5] for s in chosen) * 1e3, 2)
        out[f"{key[0]}/{key[1]}"] = entry
    return out


def markdown(result: dict) -> str:
    lines = [
        "# Host time per engine step by phase and rows",
        "",
        f"`{result['command']}`",
        "",
        f"{result['device']}, torch {result['torch']}, Python {result['python']}, {result['date']}; model "
        f"{result['model']}, {result['benchmark']} items {result['items']}, {result['dtype']}, "
        f"{result['repeats']} runs per mode (the first a warm-up).",
        "",
        "| mode | item | latency s | exact | phase / rows | steps | propose µs | commit µs | policies µs | step ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for key, e in run["by_phase_rows"].items():
            lines.append(
                f"| {run['mode']} | {run['item']} | {run['latency_s']:.2f} | {'yes' if run['exact'] else 'NO'} | {key} "
                f"| {e['steps']} | {e['propose_median_us']} ({e['propose_mean_us']}) "
                f"| {e['commit_median_us']} ({e['commit_mean_us']}) | {e['policies_median_us']} ({e['policies_mean_us']}) "
                f"| {e['step_median_ms']} |"
            )
    lines += [
        "",
        "µs: median per step (mean in brackets); rows: the rows the step fed (a drafting request's draft is its second).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-thinker-v5")
    ap.add_argument("--benchmark", default="thinker/class_synthesis")
    ap.add_argument("--data-version", default="thinker-data-v4")
    ap.add_argument("--offset", type=int, default=64)
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--modes", default="prompt-lookup,ssr+lookup,auto")
    ap.add_argument("--cot-cap", type=int, default=2500)
    ap.add_argument("--answer-cap", type=int, default=1000)
    ap.add_argument("--draft-budget", type=int, default=200)
    ap.add_argument("--max-draft", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.limit < 1:
        ap.error("--repeats and --limit must be at least 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    settings = BenchSettings(
        cot_cap=args.cot_cap,
        answer_cap=args.answer_cap,
        draft_budget=args.draft_budget,
        max_draft_len=args.max_draft,
        fixed_length=False,
    )
    samples = load_benchmark(args.benchmark, limit=args.limit, offset=args.offset, data_version=args.data_version)
    if not samples:
        ap.error(f"--offset {args.offset} selects no item of {args.benchmark}")
    llm = LLM(args.model, device=args.device, dtype=args.dtype)
    runs = []
    for sample in samples:
        reference: list[int] | None = None
        for mode in modes:
            for repeat in range(args.repeats):
                steps, tokens, latency = run_mode(llm, sample, mode, settings)
                print(
                    f"{sample.id} {mode} run {repeat + 1}/{args.repeats}: {latency:.2f} s, {len(steps)} steps",
                    flush=True,
                )
            reference = tokens if reference is None else reference
            runs.append(
                {
                    "mode": mode,
                    "item": sample.id,
                    "latency_s": round(latency, 3),
                    "tokens": len(tokens),
                    "exact": tokens == reference,
                    "by_phase_rows": summarise(steps),
                }
            )
    device = device_name(args.device)
    result = {
        "command": "python benchmarks/host_phases.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": args.model,
        "benchmark": args.benchmark,
        "items": [s.id for s in samples],
        "dtype": args.dtype,
        "repeats": args.repeats,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_phases.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "host_phases.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(run["exact"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
