"""The report's lead: our SSR modes against the best method a user already has, in the same run.

Why this and not the baseline first: beating plain greedy decoding says little when prompt
lookup or SuffixDecoding is one flag away in the same engine. The question a user brings is
"is SSR faster than what I would otherwise switch on?", so each of our modes is set against the
strongest peer of its run, and the answer is paired per sample: a ratio of latencies measured on
the same machine, the same prompt and the same caps, with a bootstrap interval that says whether
the difference outlasts the sample-to-sample noise.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from selfspec_bench.modes import SSR_MODES
from selfspec_bench.paper import MIN_VERDICT_SAMPLES
from selfspec_bench.records import BASELINE, BOOTSTRAP_RESAMPLES, Group, latency_of, paired_bootstrap_ci
from selfspec_bench.tables import fmt, markdown

PEER_MODES = ("suffix-decoding", "prompt-lookup", "suffix+lookup", "sps", "hf-prompt-lookup")
"""Methods users already have: the two copy-based speculators, both combined (the longer proposal
each step), draft-model speculation, and transformers' prompt lookup."""
OURS = SSR_MODES
"""Every SSR mode (`modes.SSR_MODES`); ssr-off, which throws its drafts away to measure what
drafting alone costs, is neither ours nor a peer and never the winner."""

FASTER, SLOWER, NOISE, TOO_FEW = "faster than the best peer", "slower", "within noise", "too few samples"


def _latencies(group: Group) -> dict[str, dict[str, float]]:
    """mode -> sample id -> latency, for the modes this section compares (records without a latency left out)."""
    wanted = {BASELINE, *PEER_MODES, *OURS}
    out: dict[str, dict[str, float]] = {}
    for mode, records in group.by_mode().items():
        if mode in wanted:
            lat = {r["sample_id"]: x for r in records if (x := latency_of(r)) is not None}
            if lat:
                out[mode] = lat
    return out


def _speedup(baseline: dict[str, float], mode: dict[str, float]) -> tuple[float | None, int]:
    """Mean over the samples both ran of baseline / mode latency (`records.mode_stats`' speedup), and n."""
    ratios = [baseline[s] / mode[s] for s in mode if s in baseline]
    return (statistics.fmean(ratios) if ratios else None), len(ratios)


def ratio_ci(
    pairs: list[tuple[float, float]], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the mean per-sample ratio peer latency / our latency.

    Why paired: the two latencies of a sample share its prompt and its lengths, so resampling
    whole samples keeps a long sample long for both. Percentile, as `records.latency_reduction_ci`
    (BCa has no interval where every resample gives the same ratio); seeded, so a rebuilt report
    is identical. None below two pairs."""
    return paired_bootstrap_ci(pairs, _mean_ratio, level=level, resamples=resamples, seed=seed)


def _mean_ratio(peer: np.ndarray, ours: np.ndarray, axis: int = -1) -> np.ndarray:
    return (peer / ours).mean(axis=axis)


def verdict(ci: tuple[float, float] | None, n: int) -> str:
    """Faster or slower only where the whole 95% interval is on one side of 1. Fewer than
    `paper.MIN_VERDICT_SAMPLES` pairs get none, as against the paper: a bootstrap over two or three
    samples gives an interval as narrow as their spread, not as wide as the benchmark's."""
    if ci is None or n < MIN_VERDICT_SAMPLES:
        return TOO_FEW
    if ci[0] > 1.0:
        return FASTER
    if ci[1] < 1.0:
        return SLOWER
    return NOISE


def peer_comparison(group: Group, exclude: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """One run's comparison: every mode's paired speedup, the best peer, each of ours against it,
    and the winner; None without a baseline, a peer and one of ours that pair with it.

    The best peer and the winner are chosen on the speedups the mode table shows (each mode paired
    with the baseline on the samples it ran); each ratio is taken on the samples where the baseline,
    the best peer and our mode all have a latency, so a sample one of them lacks counts for none."""
    lat = {mode: {s: x for s, x in per.items() if s not in exclude} for mode, per in _latencies(group).items()}
    lat = {mode: per for mode, per in lat.items() if per}
    baseline = lat.get(BASELINE)
    if not baseline:
        return None
    speedups: dict[str, dict[str, Any]] = {}
    for mode in (BASELINE, *PEER_MODES, *OURS):
        if mode in lat:
            value, n = _speedup(baseline, lat[mode])
            if value is not None:
                speedups[mode] = {"speedup": value, "n_paired": n}
    peers = [m for m in PEER_MODES if m in speedups]
    ours = [m for m in OURS if m in speedups]
    if not peers or not ours:
        return None
    best = max(peers, key=lambda m: speedups[m]["speedup"])  # first in PEER_MODES on a tie
    rows = {}
    for mode in ours:
        pairs = [(lat[best][s], lat[mode][s]) for s in sorted(baseline) if s in lat[best] and s in lat[mode]]
        ci = ratio_ci(pairs)
        rows[mode] = {
            "speedup": speedups[mode]["speedup"],
            "n_paired": speedups[mode]["n_paired"],
            "n_pairs": len(pairs),
            "ratio_vs_best_peer": statistics.fmean(p / o for p, o in pairs) if pairs else None,
            "ratio_ci95": ci,
            "verdict": verdict(ci, len(pairs)),
        }
    winner = max(speedups, key=lambda m: speedups[m]["speedup"])  # baseline first: it wins ties at 1.0
    return {
        "run": group.title,
        "model": group.model,
        "benchmark": group.benchmark,
        "settings": group.settings,
        "n_baseline": len(baseline),
        "speedups": speedups,
        "best_peer": best,
        "best_peer_speedup": speedups[best]["speedup"],
        "ours": rows,
        "winner": winner,
        "winner_speedup": speedups[winner]["speedup"],
        "winner_is_ours": winner in OURS,
    }


HEADERS = (
    "run",
    "n",
    "best peer (speedup)",
    "our mode",
    "our speedup",
    "ratio vs best peer [95% interval]",
    "verdict",
    "winner of the run",
)


def _speedup_cell(entry: dict[str, Any], n_baseline: int) -> str:
    """A speedup, with its n where the mode ran on fewer samples than the baseline (a partial run)."""
    cell = fmt(entry["speedup"], ".3f", "x")
    return cell if entry["n_paired"] == n_baseline else f"{cell}, n={entry['n_paired']}"


def _ratio_cell(row: dict[str, Any]) -> str:
    ci = row["ratio_ci95"]
    interval = "" if ci is None else f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return fmt(row["ratio_vs_best_peer"], ".3f", "x") + interval


def peer_section(groups: list[Group]) -> tuple[list[str], list[dict[str, Any]]]:
    """Markdown lines of the report's first section (one row per run x our mode) and the
    comparisons for summary.json; runs without a peer or one of ours are left out."""
    comparisons = [c for c in map(peer_comparison, groups) if c is not None]
    md = ["## Against the best peer", ""]
    if not comparisons:
        names = ", ".join(PEER_MODES)
        return md + [f"No run has both one of our SSR modes and a peer ({names}) beside its baseline.", ""], []
    # Loops flatter copy-based speculation (ours and the peers alike): the same comparison without
    # the samples whose baseline answer loops, for every run that has any.
    clean = []
    for group in groups:
        loops = frozenset(group.baseline_loop_samples())
        if loops and (c := peer_comparison(group, exclude=loops)) is not None:
            clean.append({**c, "excluded_loop_samples": sorted(loops)})
    md += [
        "Each of our SSR modes against the strongest method a user already has in the same run: the peer "
        f"({', '.join(PEER_MODES)}) with the highest paired speedup over the baseline. *Ratio vs best peer* is "
        "the mean over samples of best-peer latency / our latency, paired per sample on the samples where the "
        "baseline, the best peer and our mode all ran (*n*); > 1 means ours is faster than the best peer in "
        "the same run, < 1 slower. In brackets: the 95% paired bootstrap interval; *faster* or *slower* only "
        f"where it lies wholly above or below 1, and fewer than {MIN_VERDICT_SAMPLES} pairs get no verdict. "
        "Speedups are those of the run's mode table (with their n where a mode ran on fewer samples than the "
        "baseline); the *winner* is the mode, baseline included, with the highest of them.",
        "",
        markdown(HEADERS, _rows(comparisons)),
        "",
    ]
    if clean:
        md += ["Without the samples whose baseline answer is a loop:", "", markdown(HEADERS, _rows(clean)), ""]
    for c in comparisons:
        match = next((k for k in clean if k["run"] == c["run"]), None)
        if match is not None:
            c["without_loops"] = match
    return md, comparisons


def _rows(comparisons: list[dict[str, Any]]) -> list[list[Any]]:
    """One table row per run x our mode."""
    rows = []
    for c in comparisons:
        n_base = c["n_baseline"]
        best = f"{c['best_peer']} ({_speedup_cell(c['speedups'][c['best_peer']], n_base)})"
        winner = f"{c['winner']} ({fmt(c['winner_speedup'], '.3f', 'x')})"
        for mode, row in c["ours"].items():
            rows.append(
                [
                    c["run"],
                    row["n_pairs"],
                    best,
                    mode,
                    _speedup_cell(row, n_base),
                    _ratio_cell(row),
                    row["verdict"],
                    winner,
                ]
            )
    return rows
