"""The SSR paper's numbers, and our runs' verdicts against them.

Why a module of its own: "do we reproduce the paper?" is the question a reader brings to a
report, and its answer has rules that must hold wherever it is given (the report's headline,
the reuse ablation, summary.json): our figure is paired with the baseline of the same run, a
paper number inside our 95% interval is *within noise*, too few samples get no verdict, and a
run made mostly of repetition loops or of requests that never answer is *not comparable* —
a draft that repeats the baseline's own loop is accepted for free, and a request that stops
while still thinking has no answer to draft.
"""

from __future__ import annotations

from typing import Any

from selfspec_bench.records import BASELINE, Group
from selfspec_bench.run_checks import sharing_counts
from selfspec_bench.tables import fmt, markdown

# Reported by the SSR paper (patched vLLM, 4B models): latency reduction of full SSR.
PAPER_LATENCY_REDUCTION_PCT: dict[str, dict[str, float]] = {
    "ClassEval": {"Qwen3.5-4B": 18.5, "Gemma-4-E4B": 24.1},
    "HumanEval": {"Qwen3.5-4B": 2.9, "Gemma-4-E4B": 14.6},
    "LongProc-2K": {"Qwen3.5-4B": 9.1, "Gemma-4-E4B": 7.1},
}
PAPER_MODELS = ("Qwen3.5-4B", "Gemma-4-E4B")
# The paper's ablation on Gemma-4-E4B / ClassEval, as speedups.
PAPER_ABLATION_SPEEDUP: dict[str, float] = {"prefix": 1.086, "suffix": 1.318, "prefix+suffix": 1.318}
PAPER_ABLATION_MODEL = "Gemma-4-E4B"
_PAPER_ROW_FOR_BENCHMARK = {"classeval": "ClassEval", "humaneval": "HumanEval", "longproc": "LongProc-2K"}

FULL_SSR_MODE = "prefix+suffix"
MIN_VERDICT_SAMPLES = 5  # fewer paired samples than this get no verdict against the paper
LOOP_DOMINATED_SHARE = 0.5  # above this share of loop baselines, a run's all-sample number is not a paper-row answer


def paper_row(benchmark: str) -> str | None:
    """The paper's row for one of our benchmarks (LongProc's tasks share one), else None."""
    return _PAPER_ROW_FOR_BENCHMARK.get(benchmark.split("/")[0].lower())


def paper_table() -> str:
    """The paper's own numbers, labelled as theirs."""
    rows = [
        [bench, *(f"{by_model[m]:.1f}% ({1 / (1 - by_model[m] / 100):.3f}x)" for m in PAPER_MODELS)]
        for bench, by_model in PAPER_LATENCY_REDUCTION_PCT.items()
    ]
    ablation = ", ".join(f"{mode} {x:.3f}x" for mode, x in PAPER_ABLATION_SPEEDUP.items())
    return "\n".join(
        [
            "## Reported by the SSR paper (patched vLLM, 4B models) — theirs, not ours",
            "",
            "Latency reduction of full SSR against plain decoding (in brackets: the same as a speedup, 1 / (1 − r)).",
            "",
            markdown(["benchmark", *PAPER_MODELS], rows),
            "",
            f"Ablation ({PAPER_ABLATION_MODEL}, ClassEval), speedup: {ablation}.",
        ]
    )


def paper_beside(benchmark: str) -> str | None:
    """One sentence with the paper's numbers for a run's benchmark, or None where it has no row."""
    row = paper_row(benchmark)
    if row is None:
        return None
    theirs = ", ".join(f"{m} {PAPER_LATENCY_REDUCTION_PCT[row][m]:.1f}%" for m in PAPER_MODELS)
    return f"Theirs, for comparison (SSR paper, {row}, latency reduction of full SSR on patched vLLM): {theirs}."


def verdict(
    ours_pct: float | None, row: str | None, ci: tuple[float, float] | None = None, n: int | None = None
) -> str:
    """How our latency reduction stands against the paper's two models on the same row.

    With a 95% interval (`records.latency_reduction_ci`) a paper number inside it is "within
    noise", not beaten or missed: a verdict on five samples should not hang on one of them.
    Fewer than `MIN_VERDICT_SAMPLES` paired samples get none."""
    if row is None:
        return "no paper row"
    if ours_pct is None:
        return "n/a"
    if n is not None and n < MIN_VERDICT_SAMPLES:
        return f"too few samples ({n})"
    theirs = PAPER_LATENCY_REDUCTION_PCT[row]
    low, high = ci if ci is not None else (ours_pct, ours_pct)
    status = {
        m: "beats" if low >= theirs[m] else "below" if high < theirs[m] else "within noise of" for m in PAPER_MODELS
    }
    if all(v == "beats" for v in status.values()):
        return "matches or beats both"
    if all(v == "below" for v in status.values()):
        return "below both"
    if ci is None:
        return f"matches or beats {next(m for m in PAPER_MODELS if status[m] == 'beats')} only"
    return ", ".join(f"{v} {m}" for m, v in status.items())


def verdict_all_samples(
    ours_pct: float | None,
    row: str | None,
    samples: int,
    *,
    loops: int = 0,
    no_answer: int = 0,
    ci: tuple[float, float] | None = None,
    n: int | None = None,
) -> str:
    """The verdict, withheld when most baselines are loops or end inside thinking.

    Why: a draft that falls into the baseline's own loop is accepted for free, so a run made mostly
    of loops can "beat" the paper without saving a user anything (Gemma-3-270M, a base model forced
    3,500 tokens past its prompt on an H200: 92 of 92 baselines loops, 19.5% "faster"). And the
    paper's rows time requests that answer: a run where most requests stop while still thinking
    (natural lengths: the thinker on HumanEval, 55 of 103) has no answer to draft or verify, so
    its number says nothing about the paper's question."""
    if row is not None and samples:
        if loops / samples > LOOP_DOMINATED_SHARE:
            return f"not comparable ({loops} of {samples} baselines are loops)"
        if no_answer / samples > LOOP_DOMINATED_SHARE:
            return f"not comparable ({no_answer} of {samples} baselines give no answer)"
    return verdict(ours_pct, row, ci, n)


def ours_beside_theirs(groups: list[Group]) -> tuple[list[str], list[dict[str, Any]]]:
    """One line per run with full SSR (prefix+suffix): our latency reduction on all samples and on
    the samples whose baseline is not a loop, beside the paper's row for that benchmark.

    Why at the top of a report: it is the question a reader comes with ("do we reproduce the
    paper?"), and the loop-free column keeps loop-bought speedups from answering it."""
    rows = [row for row in map(_comparison_row, groups) if row is not None]
    if not rows:
        return [], rows
    headers = [
        "run",
        "n",
        "baseline loops",
        "baseline no answer",
        "ours",
        "ours without loop samples (n)",
        "accepted prefix",
        "exact match",
        "shared GPU",
        "paper row: " + " / ".join(PAPER_MODELS) + " (theirs)",
        "verdict (all / without loops)",
    ]
    cells = [
        [
            r["run"],
            r["n"],
            f"{r['baseline_loops']} / {r['baseline_samples']}",
            r["baseline_no_answer"],
            _with_ci(r["latency_reduction_pct"], r["latency_reduction_ci95"]),
            f"{_with_ci(r['latency_reduction_pct_without_loops'], r['latency_reduction_ci95_without_loops'])} "
            f"({r['n_without_loops']})",
            fmt(r["accepted_prefix"], ".1f"),
            fmt(r["exact_match_rate"], ".0%"),
            _sharing_cell(r["gpu_sharing"]),
            _theirs_cell(r["paper_row"]),
            f"{r['verdict']} / {r['verdict_without_loops']}",
        ]
        for r in rows
    ]
    md = [
        "## Full SSR (prefix+suffix): ours beside the paper's rows",
        "",
        "Latency reduction against the baseline of the same run; the paper's numbers (patched vLLM, 4B models) "
        "are theirs. Runs on our own thinker workload have no paper row. Where more than half of a run's "
        "baselines are loops, its all-sample number gets no verdict: a draft that repeats the baseline's loop "
        "is accepted for free; likewise where more than half end inside thinking with no answer (natural lengths). "
        "In brackets: the 95% bootstrap interval over samples; a paper number inside it is *within noise*, "
        f"and fewer than {MIN_VERDICT_SAMPLES} paired samples get no verdict. "
        "*Shared GPU*: samples that ran while another process used the GPU (`gpu_co_tenants`); sharing slows "
        "one-token forwards more than verify forwards, so their speculative speedups read high. *Not recorded*: "
        "records without `gpu_co_tenants`.",
        "",
        markdown(headers, cells),
        "",
    ]
    return md, rows


def _comparison_row(group: Group) -> dict[str, Any] | None:
    table = group.table()
    ours = table.get(FULL_SSR_MODE)
    if not ours:
        return None
    excluded = set(group.baseline_loop_samples())
    clean_table = group.table(exclude=excluded) if excluded else table
    clean = clean_table.get(FULL_SSR_MODE)
    row = paper_row(group.benchmark)
    baselines = group.baseline_count()
    no_answer = (table.get(BASELINE) or {}).get("no_answer", 0)
    clean_no_answer = (clean_table.get(BASELINE) or {}).get("no_answer", 0)
    return {
        "run": group.title,
        "n": ours["n"],
        "latency_reduction_pct": ours["latency_reduction_pct"],
        "baseline_loops": len(excluded),
        "baseline_samples": baselines,
        "baseline_no_answer": no_answer,
        "n_without_loops": clean["n"] if clean else 0,
        "latency_reduction_pct_without_loops": clean["latency_reduction_pct"] if clean else None,
        "accepted_prefix": ours["mean_accepted_prefix"],
        "exact_match_rate": ours["exact_match_rate"],
        "gpu_sharing": sharing_counts(group),
        "paper_row": row,
        "latency_reduction_ci95": ours["latency_reduction_ci95"],
        "latency_reduction_ci95_without_loops": clean["latency_reduction_ci95"] if clean else None,
        "verdict": verdict_all_samples(
            ours["latency_reduction_pct"],
            row,
            baselines,
            loops=len(excluded),
            no_answer=no_answer,
            ci=ours["latency_reduction_ci95"],
            n=ours["n_paired"],
        ),
        "verdict_without_loops": verdict_all_samples(
            clean["latency_reduction_pct"],
            row,
            baselines - len(excluded),
            no_answer=clean_no_answer,
            ci=clean["latency_reduction_ci95"],
            n=clean["n_paired"],
        )
        if clean
        else "n/a",
    }


def _with_ci(pct: float | None, ci: tuple[float, float] | None) -> str:
    """ "3.5% [2.1, 4.9]": the latency reduction and its 95% bootstrap interval."""
    return fmt(pct, ".1f", "%") + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci is not None and pct is not None else "")


def _sharing_cell(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    unknown = counts["not recorded"]
    if unknown == total:
        return "not recorded"
    return f"{counts['shared']} / {total}" + (f" ({unknown} not recorded)" if unknown else "")


def _theirs_cell(row: str | None) -> str:
    if row is None:
        return "–"
    return f"{row}: " + " / ".join(f"{PAPER_LATENCY_REDUCTION_PCT[row][m]:.1f}%" for m in PAPER_MODELS)
