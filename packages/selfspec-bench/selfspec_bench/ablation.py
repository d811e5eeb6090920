"""The report's reuse ablation beside the paper's: prefix reuse, suffix reuse, both.

The SSR paper reports its ablation on one row only (Gemma-4-E4B, ClassEval): reusing the
draft's accepted prefix alone gave 1.086x, using it as a suffix-decoding source alone 1.318x,
both 1.318x — so on their models nearly all of SSR's gain came from suffix reuse. Whether that
holds for our models is answered by the same three modes on ClassEval, set beside theirs.

A run may hold only some of the three modes (a named ablation run re-runs the baseline beside
prefix and suffix; full SSR sits in the main run), so each row is one run and each figure is
paired with the baseline of that run, never with another run's. Runs whose baselines are mostly
loops keep their numbers but are marked: a draft that repeats the loop is accepted for free.
"""

from __future__ import annotations

from typing import Any

from selfspec_bench.paper import LOOP_DOMINATED_SHARE, PAPER_ABLATION_MODEL, PAPER_ABLATION_SPEEDUP
from selfspec_bench.records import Group
from selfspec_bench.tables import fmt, markdown

ABLATION_MODES = ("prefix", "suffix", "prefix+suffix")
ABLATION_BENCHMARK = "classeval"  # the paper's ablation row


def ablation_rows(groups: list[Group]) -> list[dict[str, Any]]:
    """One row per ClassEval run that holds any of the three reuse modes; a run is marked loop-dominated
    when more than `LOOP_DOMINATED_SHARE` of its baselines loop (the paper-row table's threshold)."""
    rows = []
    for group in groups:
        if group.benchmark.split("/")[0].lower() != ABLATION_BENCHMARK:
            continue
        table = group.table()
        if not any(mode in table for mode in ABLATION_MODES):
            continue
        loops = group.baseline_loop_samples()
        clean = group.table(exclude=set(loops)) if loops else table
        baselines = group.baseline_count()
        rows.append(
            {
                "run": group.title,
                "n": baselines,
                "baseline_loops": len(loops),
                "speedup": {m: table[m]["speedup"] for m in ABLATION_MODES if m in table},
                "speedup_without_loops": {m: clean[m]["speedup"] for m in ABLATION_MODES if m in clean},
                "n_without_loops": baselines - len(loops),
                "loop_dominated": bool(baselines) and len(loops) / baselines > LOOP_DOMINATED_SHARE,
            }
        )
    return rows


def ablation_section(groups: list[Group]) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines (empty without a ClassEval reuse run) and the rows for summary.json."""
    rows = ablation_rows(groups)
    if not rows:
        return [], rows

    def cells(speedups: dict[str, float | None]) -> list[str]:
        return ["–" if speedups.get(m) is None else fmt(speedups[m], ".3f", "x") for m in ABLATION_MODES]

    table = []
    for r in rows:
        clean = (
            "n/a (0)"
            if not r["n_without_loops"]
            else f"{' / '.join(cells(r['speedup_without_loops']))} ({r['n_without_loops']})"
        )
        table.append(
            [
                f"{r['run']}{' (*loops*)' if r['loop_dominated'] else ''}",
                r["n"],
                f"{r['baseline_loops']} / {r['n']}",
                *cells(r["speedup"]),
                clean,
            ]
        )
    table.append([f"paper: {PAPER_ABLATION_MODEL} (theirs)", "–", "–", *cells(PAPER_ABLATION_SPEEDUP), "–"])
    headers = ["run", "n", "baseline loops", *ABLATION_MODES, "without loop samples (n): " + " / ".join(ABLATION_MODES)]
    md = [
        "## Reuse ablation on ClassEval: ours beside the paper's",
        "",
        "Speedup (paired per sample) of prefix reuse alone, suffix reuse alone and both, each against the baseline "
        "of its own run (a run without a mode shows –). The paper's row is theirs (Gemma-4-E4B, patched vLLM). "
        "Runs marked *loops* have baselines that are mostly repetition loops past the model's end of text, where "
        "a draft repeating the loop is accepted for free: their numbers say nothing about the paper's.",
        "",
        markdown(headers, table),
        "",
    ]
    return md, rows
