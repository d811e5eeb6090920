"""`selfspec bench report`: bench JSONL records -> report.md, summary.json and PNG plots.

Every figure is a ratio to the plain-greedy baseline measured in the same run, paired per
sample, because absolute latencies from different machines (or a 2-core CPU shared with
other jobs) say little on their own. Samples whose *baseline* answer is a repetition loop
get a second table without them: a small model forced past EOS at fixed length repeats
itself, and a draft of the same loop "matches" for free, which flatters every draft mode.

This module decides what a report holds and in what order; the figures come from
`records.py`, the checks from `run_checks.py`, the comparison with the best peer (the report's
lead) from `peers.py`, the verdicts against the paper from `paper.py`, the tables from
`tables.py` and the pictures from `plots.py`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from selfspec_bench import plots
from selfspec_bench.ablation import ablation_section
from selfspec_bench.degeneration import BLOCK_MIN_CHARS, COUNTING_MIN_TERMS, DISTINCT4_LOOP_THRESHOLD
from selfspec_bench.host_split import host_lines, host_split
from selfspec_bench.modes import SKIPPED
from selfspec_bench.paper import (
    PAPER_ABLATION_SPEEDUP,
    PAPER_LATENCY_REDUCTION_PCT,
    ours_beside_theirs,
    paper_beside,
    paper_table,
)
from selfspec_bench.peers import peer_section
from selfspec_bench.phase_split import phase_lines, phase_split
from selfspec_bench.records import (
    BASELINE,
    BUDGET_KEYS,
    Group,
    Record,
    ReportError,
    budget_families,
    group_key,
    group_records,
    load_records,
    mode_order,
    run_settings,
    settings_key,
)
from selfspec_bench.run_checks import (
    concurrency_checks,
    decode_ahead_check,
    divergence_summary,
    exactness_by_source,
    position_check,
    rerun_checks,
    sharing_check,
    timing_check,
)
from selfspec_bench.tables import (
    concurrency_lines,
    decode_ahead_lines,
    divergence_lines,
    exactness_by_source_lines,
    meta_lines,
    mode_table,
    position_tables,
    rerun_lines,
    settings_line,
    sharing_lines,
    timing_lines,
)
from selfspec_bench.throughput import batch_throughput, throughput_lines

__all__ = ["ReportError", "build_report"]

INTRODUCTION = (
    "Speedup is the mean over samples of baseline latency / mode latency, paired per sample; latency "
    "reduction is 1 − mean mode latency / mean baseline latency over the same paired samples. "
    "Oracle speedup = (CoT + answer tokens) / (CoT tokens + 1), the ceiling if every answer token "
    "came free; *oracle realized* = (speedup − 1) / (oracle − 1). Modes that also speculate inside the "
    "CoT (suffix-decoding, prompt-lookup) can realize more than 100%: the oracle counts free answer "
    "tokens only. *Forced past end-of-text*: mean answer tokens after the model's own first "
    "end-of-text (fixed lengths go on to the cap; n/a for records without the field). "
    "Pass rate grades the whole answer; where fixed lengths forced answers past the model's own "
    "end-of-text, it is also given for the answers cut there (what a user would have received)."
)


def build_report(inputs: list[Path], out_dir: Path) -> Path:
    """Write out_dir/report.md, out_dir/summary.json and the PNG plots; return report.md's path."""
    records = load_records([Path(p) for p in inputs])
    skipped = [r for r in records if r["mode"] == SKIPPED]  # samples that did not fit the context
    records = [r for r in records if r["mode"] != SKIPPED]
    groups = group_records(records)
    skipped_by_group = _skipped_by_group(skipped)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_previous_plots(out_dir)

    md = [
        "# selfspec bench report",
        "",
        f"Inputs: {', '.join(f'`{p}`' for p in inputs)} — {len(records)} records after deduplication.",
        "",
        INTRODUCTION,
        "",
    ]
    summary: dict[str, Any] = {"inputs": [str(p) for p in inputs], "n_records": len(records), "groups": []}
    # First: is SSR faster than the methods a user already has? Then the paper, the ablation, each run.
    peers_md, summary["against_best_peer"] = peer_section(groups)
    md += peers_md
    comparison_md, summary["ours_beside_theirs"] = ours_beside_theirs(groups)
    md += comparison_md
    ablation_md, summary["reuse_ablation"] = ablation_section(groups)
    md += ablation_md

    for group in groups:
        group_md, group_summary = _group_section(group, skipped_by_group.get(group.key, []), out_dir)
        md += group_md
        summary["groups"].append(group_summary)
    run_keys = {g.key for g in groups}
    for key, entries in skipped_by_group.items():
        if key in run_keys:
            continue
        model, benchmark, _ = key
        md += [f"## {model} / {benchmark}: no sample fits", "", _skipped_sentence(entries), ""]
        summary["groups"].append(
            {
                "model": model,
                "benchmark": benchmark,
                "settings": run_settings(entries[0]),
                "n_samples": 0,
                "skipped": [r["sample_id"] for r in entries],
            }
        )

    budget_md, summary["budget_plots"] = _budget_section(groups, out_dir)
    md += budget_md
    checks = concurrency_checks(groups)
    md += concurrency_lines(checks)
    if checks:
        summary["concurrency_checks"] = checks
    summary["rerun_checks"] = rerun_checks(groups)
    md += rerun_lines(summary["rerun_checks"])

    md += [paper_table(), ""]
    summary["paper"] = {
        "latency_reduction_pct": PAPER_LATENCY_REDUCTION_PCT,
        "ablation_gemma_classeval_speedup": PAPER_ABLATION_SPEEDUP,
    }
    report_path = out_dir / "report.md"
    report_path.write_text("\n".join(md))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return report_path


def _group_section(group: Group, skipped: list[Record], out_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """One run's section of report.md (its tables, checks, loop-free table, plot, metadata) and of summary.json."""
    stem = _plot_stem(group.model, group.benchmark, group.key[2])
    table = group.table()
    excluded = group.baseline_loop_samples()
    table_clean = group.table(exclude=set(excluded)) if excluded else table
    latency_png = plots.plot_latency_split(group.title, table, out_dir / f"latency_{stem}.png")
    meta = group.meta()
    timing = timing_check(group)
    divergences = divergence_summary(group)
    by_source = exactness_by_source(group)
    positions = position_check(group)
    sharing = sharing_check(group)
    host = host_split(group)
    phases = phase_split(group)
    throughput = batch_throughput(group)

    md = [f"## {group.title}", "", f"Settings: {settings_line(group.settings)}", ""]
    if skipped:
        md += [_skipped_sentence(skipped), ""]
    md += [
        mode_table(table),
        "",
        *decode_ahead_lines(decode_ahead_check(group)),
        *throughput_lines(throughput),
        *timing_lines(timing),
        *position_tables(group, positions),
        *phase_lines(phases),
        *host_lines(host),
        *sharing_lines(sharing),
        *divergence_lines(divergences),
        *exactness_by_source_lines(by_source),
    ]
    md += ["### Excluding samples whose baseline answer is a loop", "", _exclusion_sentence(group, excluded), ""]
    if excluded and table_clean:
        md += [mode_table(table_clean), ""]
    elif excluded:
        md += ["Every sample was excluded: no table without loops for this run.", ""]
    beside = paper_beside(group.benchmark)
    if beside:
        md += [beside, ""]
    md += [f"![latency split, {group.title}]({latency_png.name})", "", "Run metadata:", "", *meta_lines(meta), ""]
    summary = {
        "model": group.model,
        "benchmark": group.benchmark,
        "settings": group.settings,
        "n_samples": len({r["sample_id"] for r in group.records}),
        "modes": table,
        "excluded_loop_samples": excluded,
        "modes_excluding_loops": table_clean,
        "meta": meta,
        "plots": {"latency": latency_png.name},
        "timing_check": timing,
        "host_split": host,
        "phase_split": phases,
        "throughput": throughput,
        "run_position_check": {m: {str(p): v for p, v in per.items()} for m, per in positions.items()},
        "gpu_sharing_check": sharing,
        "skipped": [r["sample_id"] for r in skipped],
        "divergences": divergences,
        "exact_match_by_source": {
            src: {m: {"exact": e, "compared": n} for m, (e, n) in per.items()} for src, per in by_source.items()
        },
    }
    return md, summary


def _budget_section(groups: list[Group], out_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """One speedup-vs-draft-budget plot per family of runs that differ only in the budget."""
    md = ["## Speedup against draft budget", ""]
    entries = []
    for family in budget_families(groups):
        head = family[0]
        stem = _plot_stem(head.model, head.benchmark, settings_key(head.settings, drop=BUDGET_KEYS))
        png = plots.plot_speedup_vs_budget(
            head.label, _budget_series(family), _budget_series(family, no_loops=True), out_dir / f"budget_{stem}.png"
        )
        budgets = sorted({g.settings.get("draft_budget") for g in family}, key=lambda b: (b is None, b or 0))
        md += [
            f"![speedup vs draft budget, {head.label}]({png.name})",
            "",
            f"{head.label}: draft budgets {', '.join(map(str, budgets))}"
            + (" (a single budget: one point per mode)." if len(budgets) == 1 else "."),
            "",
        ]
        entries.append({"model": head.model, "benchmark": head.benchmark, "plot": png.name, "draft_budgets": budgets})
    return md, entries


def _budget_series(family: list[Group], no_loops: bool = False) -> dict[str, list[tuple[float, float]]]:
    """mode -> [(draft budget, paired speedup)], sorted by budget; the baseline is left out (always 1)."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for group in family:
        budget = group.settings.get("draft_budget")
        if not isinstance(budget, (int, float)):
            continue
        table = group.table(exclude=set(group.baseline_loop_samples())) if no_loops else group.table()
        for mode, stats in table.items():
            if mode != BASELINE and stats["speedup"] is not None:
                series[mode].append((float(budget), stats["speedup"]))
    return {mode: sorted(series[mode]) for mode in mode_order(series)}


def _exclusion_sentence(group: Group, excluded: list[str]) -> str:
    samples = {r["sample_id"] for r in group.records}
    if not any(r["mode"] == BASELINE for r in group.records):
        return "No baseline records, so loops cannot be judged per sample; nothing excluded."
    kinds = f" ({_loop_kinds(group, excluded)})" if excluded else ""
    return (
        f"{len(excluded)} of {len(samples)} samples excluded because their baseline answer is a loop"
        f"{kinds}: small models forced past EOS at a fixed answer length fall "
        'into repetition, and a draft that repeats the same loop "matches" almost for free, which '
        "flatters every draft mode." + (f" Excluded: {', '.join(excluded)}." if excluded else "")
    )


def _loop_kinds(group: Group, excluded: list[str]) -> str:
    """How the excluded baselines were judged loops, e.g. "38 by distinct-4-gram ratio below 0.5,
    1 by a counting run" (the measures are in `degeneration.py`)."""
    names = {
        "distinct-4": f"distinct-4-gram ratio below {DISTINCT4_LOOP_THRESHOLD}",
        "repeated block": f"a block repeated back to back over >= {BLOCK_MIN_CHARS} characters",
        "counting run": f"a counting run of >= {COUNTING_MIN_TERMS} numbers",
    }
    kinds: dict[str, int] = defaultdict(int)
    wanted = set(excluded)
    for rec in group.records:
        if rec["mode"] == BASELINE and rec["sample_id"] in wanted:
            kinds[rec.get("loop_kind") or "distinct-4"] += 1
    return ", ".join(f"{n} by {names.get(kind, kind)}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def _skipped_by_group(skipped: list[Record]) -> dict[tuple, list[Record]]:
    out: dict[tuple, list[Record]] = defaultdict(list)
    for rec in skipped:
        out[group_key(rec)].append(rec)
    return dict(out)


def _skipped_sentence(entries: list[Record]) -> str:
    contexts = sorted({r.get("context") for r in entries if r.get("context") is not None})
    ids = sorted(r["sample_id"] for r in entries)
    shown = ", ".join(ids[:10]) + (f", … ({len(ids) - 10} more)" if len(ids) > 10 else "")
    return (
        f"**Skipped: {len(ids)} samples** whose prompt + CoT cap + answer cap exceed the model's context "
        f"({', '.join(map(str, contexts))} tokens); they are not in the tables: {shown}."
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:60] or "x"


def _plot_stem(model: str, benchmark: str, settings_key: str) -> str:
    """A plot's file stem: model, benchmark and a short hash of the run's settings.

    Why a hash and not the group's place in the report: a place shifts whenever a new run sorts
    before the others, which would rename the plots of every run after it; hashed, a run's plots
    keep their names for as long as its settings do."""
    digest = hashlib.sha1("\0".join((model, benchmark, settings_key)).encode()).hexdigest()[:8]  # slugs may collide
    return f"{_slug(model)}_{_slug(benchmark)}_{digest}"


# Both kinds of plot name are the report's own, so a rebuild removes either: by settings hash
# (`_plot_stem`), and by place in the report (`latency_00_<model>_<benchmark>.png`, which result
# directories built with that scheme still hold).
_PLOT_NAME = re.compile(r"(latency|budget)_(\d{2}_.+|.+_[0-9a-f]{8})\.png")


def _remove_previous_plots(out_dir: Path) -> None:
    """Delete plots an earlier report wrote here: a run no longer reported (or one whose
    settings changed) would leave its plots beside the report as if current."""
    for path in out_dir.glob("*.png"):
        if _PLOT_NAME.fullmatch(path.name):
            path.unlink()
