"""Checks that a run's paired speedups compare like with like, and where exactness broke.

A paired speedup assumes every mode of a sample ran under the same conditions. These checks
look for what breaks that: a batch that paid for compilations (`timing_check`), a place in the
run order that costs more (`position_check`), a GPU shared with other processes
(`sharing_check`), batching (`concurrency_checks`), a rerun under another condition
(`rerun_checks`); and, for lossless modes, where and in which forward shape a record left its
baseline's tokens (`divergence_summary`, `exactness_by_source`). They compute; `report.py`
writes them out.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from selfspec_bench.records import (
    BASELINE,
    Group,
    Record,
    latency_of,
    mode_order,
    mode_stats,
    ms_per_forward,
    settings_key,
)


def divergence_summary(group: Group) -> dict[str, dict[str, Any]]:
    """Per mode: how many records left their baseline's tokens, in which phase, and the forward
    shapes (batch rows x tokens, key length left out) that chose the first differing token in the
    mode and in the baseline.

    Why: in bf16 a lossless mode leaves the baseline where a near-tie comes out differently; the
    shapes at the divergences say whether a forward of another shape chose the token (on a CPU it
    usually did) or one of the baseline's own shape (on the H200 often: there the runs differ in
    state, `scripts/gpu_logit_trace.py`)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in sorted({r["mode"] for r in group.records} - {BASELINE}):
        recs = [r for r in group.records if r["mode"] == mode and "first_divergence" in r]
        left = [r for r in recs if r.get("first_divergence") is not None]
        if not left:
            continue
        pairs = Counter(
            (
                str(r.get("first_divergence_shape", "?")).split("/")[0],
                str(r.get("baseline_shape_at_divergence", "?")).split("/")[0],
            )
            for r in left
        )
        out[mode] = {
            "compared": len(recs),
            "left_baseline": len(left),
            "in_cot": sum(r.get("first_divergence_phase") == "cot" for r in left),
            "in_answer": sum(r.get("first_divergence_phase") == "answer" for r in left),
            "shapes": [{"mode_shape": m, "baseline_shape": b, "count": n} for (m, b), n in pairs.most_common()],
        }
    return out


def exactness_by_source(group: Group) -> dict[str, dict[str, tuple[int, int]]]:
    """Per package source hash (`versions.selfspec_source`; "before hashes" for records without one),
    per mode: (records equal to their baseline, records compared).

    Why: benchmark files resume across code changes, so one table can mix engines; an exact-match
    rate is only evidence about the code that produced it."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for r in group.records:
        if r["mode"] == BASELINE or r.get("exact_match") is None:
            continue
        source = (r.get("versions") or {}).get("selfspec_source") or "before hashes"
        exact, n = out.setdefault(source, {}).get(r["mode"], (0, 0))
        out[source][r["mode"]] = (exact + bool(r["exact_match"]), n + 1)
    return out


TIMING_OUTLIER_RATIO = 1.25


def timing_check(group: Group) -> dict[str, Any]:
    """Time per forward of each mode in each batch of samples (the samples that shared the
    engine's batch, in the order they ran), and the cells that stand out.

    Why: the paired speedup assumes every mode of a sample ran under the same conditions. A
    first timed run that pays for compilations (seen on the H200: a baseline at 1.6x the
    per-forward time of later batches) makes every other mode of that batch look fast. A
    cell slower than `TIMING_OUTLIER_RATIO` x its mode's median over batches is flagged.
    """
    concurrency = max(1, int(group.settings.get("concurrency") or 1))
    order = list(dict.fromkeys(r["sample_id"] for r in group.records if r["mode"] == BASELINE))
    batch_of = {sid: i // concurrency for i, sid in enumerate(order)}
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in group.records:
        ms = ms_per_forward(rec)
        if rec["sample_id"] in batch_of and ms is not None:
            cells[rec["mode"]][batch_of[rec["sample_id"]]].append(ms)
    table: dict[str, dict[int, float]] = {
        mode: {b: statistics.median(v) for b, v in sorted(per_batch.items())} for mode, per_batch in cells.items()
    }
    flagged = []
    for mode, per_batch in table.items():
        if len(per_batch) < 2:
            continue
        typical = statistics.median(per_batch.values())
        for batch, ms in per_batch.items():
            if ms > TIMING_OUTLIER_RATIO * typical:
                flagged.append({"mode": mode, "batch": batch, "ms_per_forward": ms, "median_ms": typical})
    return {"concurrency": concurrency, "ms_per_forward": table, "flagged": flagged}


def position_check(group: Group, warmed: bool | None = None) -> dict[str, dict[int, dict[str, float]]]:
    """Median time per forward of each mode at each place in its sample's run order.

    Why: a place in the order can cost something of its own (on an H200, half-second requests,
    a baseline always run first took ~9% longer per forward than the same steps run later),
    which flatters or penalises whichever mode holds it. The runner rotates every mode through
    every place and records `run_position`; this table shows whether a place still costs
    something (a column higher than the others in every mode). Empty for records without
    `run_position`. `warmed`: only records whose sample had (True) or had not (False) short
    untimed runs before its timed ones.
    """
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in group.records:
        if warmed is not None and bool(rec.get("group_warm_up")) != warmed:
            continue
        position, ms = rec.get("run_position"), ms_per_forward(rec)
        if position and ms is not None:
            cells[rec["mode"]][int(position)].append(ms)
    return {
        mode: {pos: {"n": len(v), "median_ms_per_forward": statistics.median(v)} for pos, v in sorted(per.items())}
        for mode, per in cells.items()
    }


SHARING_CONDITIONS = ("alone", "shared", "not recorded")


def _sample_sharing(records: list[Record]) -> str:
    """A sample's condition from its records' `gpu_co_tenants`: shared if any record saw
    another process on the GPU, alone if every record saw none, else not recorded."""
    seen = [r.get("gpu_co_tenants") for r in records]
    if any(n for n in seen if n is not None):
        return "shared"
    if seen and all(n == 0 for n in seen):
        return "alone"
    return "not recorded"


def sample_sharing(group: Group) -> dict[str, str]:
    """Each sample's condition: alone, shared or not recorded (`_sample_sharing`)."""
    return {sid: _sample_sharing(recs) for sid, recs in group.by_sample().items()}


def sharing_counts(group: Group) -> dict[str, int]:
    """How many of a run's samples ran alone, shared the GPU, or did not record it (every condition, 0 too)."""
    counts = Counter(sample_sharing(group).values())
    return {condition: counts[condition] for condition in SHARING_CONDITIONS}


def sharing_check(group: Group) -> dict[str, Any]:
    """Per-mode time per forward and paired speedup of samples that ran alone on their GPU,
    beside those that shared it with other processes (and those that did not record it).

    Why: two bench processes on one H200 made every forward take 1.7-2.1x as long as on a GPU
    of its own, so a table that mixes both conditions holds mean latencies of two experiments.
    Every mode of a sample runs in one process back to back, yet sharing still moves paired
    speedups: it slows one-token forwards more than verify forwards, so the speculative modes
    read faster shared (SmolLM2 on the same 8 LongProc tom_tracking samples, prompt lookup 4.30x
    shared and 3.61x alone: the rerun table of `selfspec bench report` over
    benchmarks/ssr_paper_rows/records/h200/smollm2_longproc-tom_tracking*.jsonl.gz). Empty unless some
    record says it shared the GPU."""
    condition = sample_sharing(group)
    if "shared" not in condition.values():
        return {}
    baseline = {r["sample_id"]: r for r in group.records if r["mode"] == BASELINE}
    cells: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for rec in group.records:
        cells[rec["mode"]][condition[rec["sample_id"]]].append(rec)

    def cell(recs: list[Record]) -> dict[str, Any]:
        ms = [m for m in map(ms_per_forward, recs) if m is not None]
        speedups = [
            base / lat for r in recs if (base := latency_of(baseline.get(r["sample_id"]))) and (lat := latency_of(r))
        ]
        return {
            "n": len(recs),
            "median_ms_per_forward": statistics.median(ms) if ms else None,
            "mean_speedup": statistics.fmean(speedups) if speedups else None,
        }

    table = {mode: {cond: cell(recs) for cond, recs in per.items()} for mode, per in cells.items()}
    counts = {cond: sum(1 for c in condition.values() if c == cond) for cond in SHARING_CONDITIONS}
    return {"samples": {c: n for c, n in counts.items() if n}, "modes": table}


def concurrency_checks(groups: list[Group]) -> list[dict[str, Any]]:
    """Pairs of runs that differ only in `concurrency` (1 vs N): per-mode speedups on their common samples."""
    by_key: dict[tuple, dict[int, Group]] = defaultdict(dict)
    for g in groups:
        key = (g.model, g.benchmark, settings_key(g.settings, drop=("concurrency",)))
        by_key[key][int(g.settings.get("concurrency", 1))] = g
    checks = []
    for runs in by_key.values():
        single = runs.get(1)
        for level, batched in sorted(runs.items()):
            if level == 1 or single is None:
                continue
            common = {r["sample_id"] for r in single.records} & {r["sample_id"] for r in batched.records}
            if not common:
                continue
            modes: dict[str, dict[str, Any]] = {}
            for mode in mode_order(r["mode"] for r in batched.records):
                if mode == BASELINE:
                    continue
                row = {}
                for name, group in (("single", single), ("batched", batched)):
                    base = {
                        r["sample_id"]: r for r in group.records if r["mode"] == BASELINE and r["sample_id"] in common
                    }
                    recs = [r for r in group.records if r["mode"] == mode and r["sample_id"] in common]
                    row[name] = mode_stats(recs, base)["speedup"] if recs else None
                row["difference"] = None if None in (row["single"], row["batched"]) else row["batched"] - row["single"]
                modes[mode] = row
            checks.append({"label": single.label, "concurrency": level, "n_common": len(common), "modes": modes})
    return checks


def rerun_checks(groups: list[Group]) -> list[dict[str, Any]]:
    """Named runs (`--run-name`) beside the unnamed run of the same settings, on their common
    samples: per mode, median ms per forward and mean paired speedup in each run, and how many
    samples gave the same output tokens both times.

    Why: a named run that reruns samples of another run under another condition (e.g.
    `--run-name alone-check`: samples that ran on a shared GPU, again with the GPU to itself)
    answers a question the sharing table cannot — the same samples, so any difference is the
    condition's or noise, not the samples'. Runs that share no sample are left out."""
    by_key: dict[tuple, dict[str | None, Group]] = defaultdict(dict)
    for g in groups:
        by_key[(g.model, g.benchmark, settings_key(g.settings, drop=("run_name",)))][g.settings.get("run_name")] = g
    checks = []
    for runs in by_key.values():
        reference = runs.get(None)
        for name, named in sorted((k, v) for k, v in runs.items() if k is not None):
            if reference is None:
                continue
            common = {r["sample_id"] for r in reference.records} & {r["sample_id"] for r in named.records}
            if not common:
                continue
            sides = {"reference": reference, "named": named}
            recs = {
                side: {(r["sample_id"], r["mode"]): r for r in g.records if r["sample_id"] in common}
                for side, g in sides.items()
            }
            modes: dict[str, dict[str, Any]] = {}
            shared_modes = {m for (_, m) in recs["reference"]} & {m for (_, m) in recs["named"]}
            for mode in mode_order(shared_modes):
                row: dict[str, Any] = {}
                for side in sides:
                    mine = [r for (sid, m), r in recs[side].items() if m == mode]
                    base = {sid: r for (sid, m), r in recs[side].items() if m == BASELINE}
                    ms = [m for m in map(ms_per_forward, mine) if m is not None]
                    row[side] = {
                        "n": len(mine),
                        "median_ms_per_forward": statistics.median(ms) if ms else None,
                        "speedup": None if mode == BASELINE else mode_stats(mine, base)["speedup"],
                    }
                pairs = [
                    (recs["reference"][(sid, mode)], recs["named"][(sid, mode)])
                    for sid in sorted(common)
                    if (sid, mode) in recs["reference"] and (sid, mode) in recs["named"]
                ]
                row["same_tokens"] = sum(
                    1 for a, b in pairs if a.get("output_hash") and a.get("output_hash") == b.get("output_hash")
                )
                row["compared"] = len(pairs)
                modes[mode] = row
            sharing = {}
            for side, by_pair in recs.items():
                per_sample: dict[str, list[Record]] = defaultdict(list)
                for (sid, _), r in by_pair.items():
                    per_sample[sid].append(r)
                sharing[side] = dict(Counter(_sample_sharing(rs) for rs in per_sample.values()))
            checks.append(
                {
                    "label": reference.label,
                    "run_name": name,
                    "n_common": len(common),
                    "modes": modes,
                    "sharing": sharing,
                }
            )
    return checks


def decode_ahead_check(group: Group) -> dict[str, int | None]:
    """Per mode, the steps that took a forward launched one step ahead (`engine.decode_ahead`),
    a batch's counted once; None where every run of the mode decoded serially (a schedule
    recorder, no CUDA graphs). Empty for records from before the field: the report then says
    nothing. Why: a plain baseline that decodes serially is slower than the engine users run."""
    steps: dict[str, int | None] = {}
    seen: set[tuple[str, Any]] = set()
    for rec in group.records:
        if "decode_ahead_steps" not in rec:
            continue
        mode, n = rec["mode"], rec["decode_ahead_steps"]
        batch = rec.get("batch")
        if batch is not None:
            if (mode, batch) in seen:
                continue
            seen.add((mode, batch))
        steps.setdefault(mode, None)
        if n is not None:
            steps[mode] = (steps[mode] or 0) + n
    return steps
