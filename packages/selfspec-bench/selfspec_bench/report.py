"""`selfspec bench report`: bench JSONL records -> report.md, summary.json and PNG plots.

Every figure is a ratio to the plain-greedy baseline measured in the same run, paired per
sample, because absolute latencies from different machines (or a 2-core CPU shared with
other jobs) say little on their own. Samples whose *baseline* answer is a repetition loop
get a second table without them: a small model forced past EOS at fixed length repeats
itself, and a draft of the same loop "matches" for free, which flatters every draft mode.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from selfspec_bench.ablation import ablation_section
from selfspec_bench.degeneration import BLOCK_MIN_CHARS, COUNTING_MIN_TERMS, DISTINCT4_LOOP_THRESHOLD
from selfspec_bench.modes import SKIPPED
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
    SHARING_CONDITIONS,
    concurrency_checks,
    divergence_summary,
    exactness_by_source,
    position_check,
    rerun_checks,
    sample_sharing,
    sharing_check,
    timing_check,
)

__all__ = ["ReportError", "build_report", "group_records", "load_records", "ours_beside_theirs", "paper_table"]


# Reported by the SSR paper (patched vLLM, 4B models): latency reduction of full SSR.
PAPER_LATENCY_REDUCTION_PCT: dict[str, dict[str, float]] = {
    "ClassEval": {"Qwen3.5-4B": 18.5, "Gemma-4-E4B": 24.1},
    "HumanEval": {"Qwen3.5-4B": 2.9, "Gemma-4-E4B": 14.6},
    "LongProc-2K": {"Qwen3.5-4B": 9.1, "Gemma-4-E4B": 7.1},
}
PAPER_MODELS = ("Qwen3.5-4B", "Gemma-4-E4B")
# The paper's ablation on Gemma-4-E4B / ClassEval, as speedups.
PAPER_ABLATION_SPEEDUP: dict[str, float] = {"prefix": 1.086, "suffix": 1.318, "prefix+suffix": 1.318}
_PAPER_ROW_FOR_BENCHMARK = {"classeval": "ClassEval", "humaneval": "HumanEval", "longproc": "LongProc-2K"}


def _fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:{spec}}{suffix}"


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.0f}%"


TABLE_HEADER = (
    "| mode | n | latency (s) | speedup (paired) | latency reduction | accepted prefix | suffix-accepted "
    "| first answer token (s) | oracle speedup | oracle realized | exact match | pass rate | loops | no answer "
    "| forced past end-of-text |"
)


def markdown_table(table: dict[str, dict[str, Any]]) -> str:
    rows = [TABLE_HEADER, "|" + "---|" * (TABLE_HEADER.count("|") - 1)]
    for mode, s in table.items():
        pass_rate = f"{_pct(s['pass_rate'])} ({s['n_scored']})" if s["n_scored"] else "n/a"
        if s.get("n_scored_at_eos") and s.get("mean_forced_past_eos"):  # some answers were forced past their end
            pass_rate += f"; cut at its end-of-text {_pct(s['pass_rate_at_eos'])} ({s['n_scored_at_eos']})"
        no_answer = s.get("no_answer", 0)
        first_answer = _fmt(s["mean_first_answer_token_s"])
        if no_answer and s["mean_first_answer_token_s"] is not None:
            first_answer += f" ({s['n'] - no_answer} answered)"  # a mean over the runs that answered
        rows.append(
            f"| {mode} | {s['n']} | {_fmt(s['mean_latency_s'])} | {_fmt(s['speedup'], '.3f', 'x')} "
            f"| {_fmt(s['latency_reduction_pct'], '.1f', '%')} | {_fmt(s['mean_accepted_prefix'], '.1f')} "
            f"| {_fmt(s['mean_suffix_accepted_tokens'], '.1f')} | {first_answer} "
            f"| {_fmt(s['mean_oracle_speedup'], '.3f', 'x')} | {_pct(s['oracle_fraction'])} "
            f"| {_pct(s['exact_match_rate'])} | {pass_rate} | {s['loops']} | {no_answer} "
            f"| {_fmt(s.get('mean_forced_past_eos'), '.0f')} |"
        )
    return "\n".join(rows)


def _settings_line(settings: dict[str, Any]) -> str:
    parts = []
    for key, value in settings.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
            parts.append(f"{key}({value})")
        elif isinstance(value, list):
            parts.append(f"{key}={'+'.join(map(str, value))}")
        else:
            parts.append(f"{key}={value}")
    return "; ".join(parts) if parts else "n/a"


def paper_table() -> str:
    lines = [
        "## Reported by the SSR paper (patched vLLM, 4B models) — theirs, not ours",
        "",
        "Latency reduction of full SSR against plain decoding (in brackets: the same as a speedup, 1 / (1 − r)).",
        "",
        "| benchmark | " + " | ".join(PAPER_MODELS) + " |",
        "|---|" + "---|" * len(PAPER_MODELS),
    ]
    for bench, by_model in PAPER_LATENCY_REDUCTION_PCT.items():
        cells = [f"{by_model[m]:.1f}% ({1 / (1 - by_model[m] / 100):.3f}x)" for m in PAPER_MODELS]
        lines.append(f"| {bench} | " + " | ".join(cells) + " |")
    lines += ["", "Ablation (Gemma-4-E4B, ClassEval), speedup: "
              + ", ".join(f"{mode} {x:.3f}x" for mode, x in PAPER_ABLATION_SPEEDUP.items()) + "."]
    return "\n".join(lines)


FULL_SSR_MODE = "prefix+suffix"


def _paper_row(benchmark: str) -> str | None:
    return _PAPER_ROW_FOR_BENCHMARK.get(benchmark.split("/")[0].lower())


MIN_VERDICT_SAMPLES = 5  # fewer paired samples than this get no verdict against the paper


def _verdict(ours_pct: float | None, row: str | None, ci: tuple[float, float] | None = None,
             n: int | None = None) -> str:
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
    status = {m: "beats" if low >= theirs[m] else "below" if high < theirs[m] else "within noise of"
              for m in PAPER_MODELS}
    if all(v == "beats" for v in status.values()):
        return "matches or beats both"
    if all(v == "below" for v in status.values()):
        return "below both"
    if ci is None:
        return f"matches or beats {next(m for m in PAPER_MODELS if status[m] == 'beats')} only"
    return ", ".join(f"{v} {m}" for m, v in status.items())


LOOP_DOMINATED_SHARE = 0.5  # above this share of loop baselines, a run's all-sample number is not a paper-row answer


def _verdict_all_samples(ours_pct: float | None, row: str | None, samples: int, *, loops: int = 0,
                         no_answer: int = 0, ci: tuple[float, float] | None = None, n: int | None = None) -> str:
    """The verdict, withheld when most baselines are loops or end inside thinking.

    Why: a draft that falls into the baseline's own loop is accepted for free, so a run made mostly
    of loops can "beat" the paper without saving a user anything (session 8: Gemma-3-270M, a base
    model forced 3,500 tokens past its prompt, 92 of 92 baselines loops, 19.5% "faster"). And the
    paper's rows time requests that answer: a run where most requests stop while still thinking
    (natural lengths; session 10: the thinker on HumanEval, 55 of 103) has no answer to draft or
    verify, so its number says nothing about the paper's question."""
    if row is not None and samples:
        if loops / samples > LOOP_DOMINATED_SHARE:
            return f"not comparable ({loops} of {samples} baselines are loops)"
        if no_answer / samples > LOOP_DOMINATED_SHARE:
            return f"not comparable ({no_answer} of {samples} baselines give no answer)"
    return _verdict(ours_pct, row, ci, n)


def ours_beside_theirs(groups: list[Group]) -> tuple[list[str], list[dict[str, Any]]]:
    """One line per run with full SSR (prefix+suffix): our latency reduction on all samples and on
    the samples whose baseline is not a loop, beside the paper's row for that benchmark.

    Why at the top: it is the question a reader comes with ("do we reproduce the paper?"), and the
    loop-free column keeps loop-bought speedups from answering it."""
    rows: list[dict[str, Any]] = []
    for group in groups:
        table = group.table()
        ours = table.get(FULL_SSR_MODE)
        if not ours:
            continue
        excluded = set(group.baseline_loop_samples())
        clean_table = group.table(exclude=excluded) if excluded else table
        clean = clean_table.get(FULL_SSR_MODE)
        row = _paper_row(group.benchmark)
        baselines = group.baseline_count()
        no_answer = (table.get(BASELINE) or {}).get("no_answer", 0)
        clean_no_answer = (clean_table.get(BASELINE) or {}).get("no_answer", 0)
        rows.append({
            "run": group.title, "n": ours["n"], "latency_reduction_pct": ours["latency_reduction_pct"],
            "baseline_loops": len(excluded), "baseline_samples": baselines, "baseline_no_answer": no_answer,
            "n_without_loops": clean["n"] if clean else 0,
            "latency_reduction_pct_without_loops": clean["latency_reduction_pct"] if clean else None,
            "accepted_prefix": ours["mean_accepted_prefix"], "exact_match_rate": ours["exact_match_rate"],
            "gpu_sharing": _sharing_counts(group),
            "paper_row": row,
            "latency_reduction_ci95": ours["latency_reduction_ci95"],
            "latency_reduction_ci95_without_loops": clean["latency_reduction_ci95"] if clean else None,
            "verdict": _verdict_all_samples(ours["latency_reduction_pct"], row, baselines, loops=len(excluded),
                                            no_answer=no_answer, ci=ours["latency_reduction_ci95"], n=ours["n_paired"]),
            "verdict_without_loops": (_verdict_all_samples(clean["latency_reduction_pct"], row, baselines - len(excluded),
                                                           no_answer=clean_no_answer, ci=clean["latency_reduction_ci95"],
                                                           n=clean["n_paired"]) if clean else "n/a"),
        })
    if not rows:
        return [], rows
    md = ["## Full SSR (prefix+suffix): ours beside the paper's rows", "",
          "Latency reduction against the baseline of the same run; the paper's numbers (patched vLLM, 4B models) "
          "are theirs. Runs on our own thinker workload have no paper row. Where more than half of a run's "
          "baselines are loops, its all-sample number gets no verdict: a draft that repeats the baseline's loop "
          "is accepted for free; likewise where more than half end inside thinking with no answer (natural lengths). "
          "In brackets: the 95% bootstrap interval over samples; a paper number inside it is *within noise*, "
          f"and fewer than {MIN_VERDICT_SAMPLES} paired samples get no verdict. "
          "*Shared GPU*: samples that ran while another process used the GPU (`gpu_co_tenants`); their speculative "
          "speedups read high (session 14, the same samples shared and alone: prefix+suffix 1.095x vs 1.054x, "
          "prompt lookup 4.30x vs 3.61x). *Not recorded*: written before records carried it (the H200 runs of "
          "sessions 3–12 had one queue per GPU).", "",
          "| run | n | baseline loops | baseline no answer | ours | ours without loop samples (n) | accepted prefix "
          "| exact match | shared GPU | paper row: " + " / ".join(PAPER_MODELS) + " (theirs) | verdict (all / without loops) |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        theirs = ("–" if r["paper_row"] is None else f"{r['paper_row']}: "
                  + " / ".join(f"{PAPER_LATENCY_REDUCTION_PCT[r['paper_row']][m]:.1f}%" for m in PAPER_MODELS))
        md.append(f"| {r['run']} | {r['n']} | {r['baseline_loops']} / {r['baseline_samples']} "
                  f"| {r['baseline_no_answer']} | {_with_ci(r['latency_reduction_pct'], r['latency_reduction_ci95'])} "
                  f"| {_with_ci(r['latency_reduction_pct_without_loops'], r['latency_reduction_ci95_without_loops'])} "
                  f"({r['n_without_loops']}) "
                  f"| {_fmt(r['accepted_prefix'], '.1f')} | {_pct(r['exact_match_rate'])} | {_sharing_cell(r['gpu_sharing'])} "
                  f"| {theirs} "
                  f"| {r['verdict']} / {r['verdict_without_loops']} |")
    return md + [""], rows


def _with_ci(pct: float | None, ci: tuple[float, float] | None) -> str:
    """"3.5% [2.1, 4.9]": the latency reduction and its 95% bootstrap interval."""
    return _fmt(pct, ".1f", "%") + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci is not None and pct is not None else "")


def _sharing_counts(group: Group) -> dict[str, int]:
    """How many of a run's samples ran alone, shared the GPU, or did not record it."""
    counts = {condition: 0 for condition in SHARING_CONDITIONS}
    for condition in sample_sharing(group).values():
        counts[condition] += 1
    return counts


def _sharing_cell(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    unknown = counts["not recorded"]
    if unknown == total:
        return "not recorded"
    return f"{counts['shared']} / {total}" + (f" ({unknown} not recorded)" if unknown else "")


def _paper_beside(benchmark: str) -> str | None:
    row = _paper_row(benchmark)
    if row is None:
        return None
    theirs = ", ".join(f"{m} {PAPER_LATENCY_REDUCTION_PCT[row][m]:.1f}%" for m in PAPER_MODELS)
    return f"Theirs, for comparison (SSR paper, {row}, latency reduction of full SSR on patched vLLM): {theirs}."


def _meta_lines(meta: dict[str, list[Any]]) -> list[str]:
    lines = []
    for key in ("device", "dtype", "date"):
        lines.append(f"- {key}: {', '.join(map(str, meta[key])) or 'n/a'}")
    versions = ["; ".join(f"{k} {v}" for k, v in v.items()) if isinstance(v, dict) else str(v) for v in meta["versions"]]
    lines.append(f"- versions: {' | '.join(versions) or 'n/a'}")
    lines += [f"- command: `{cmd}`" for cmd in meta["command"]] or ["- command: n/a"]
    return lines


def _exclusion_sentence(group: Group, excluded: list[str]) -> str:
    samples = {r["sample_id"] for r in group.records}
    if not any(r["mode"] == BASELINE for r in group.records):
        return "No baseline records, so loops cannot be judged per sample; nothing excluded."
    kinds = f" ({_loop_kinds(group, excluded)})" if excluded else ""
    return (
        f"{len(excluded)} of {len(samples)} samples excluded because their baseline answer is a loop"
        f"{kinds}: small models forced past EOS at a fixed answer length fall "
        "into repetition, and a draft that repeats the same loop \"matches\" almost for free, which "
        "flatters every draft mode." + (f" Excluded: {', '.join(excluded)}." if excluded else "")
    )


def _loop_kinds(group: Group, excluded: list[str]) -> str:
    """How the excluded baselines were judged loops, e.g. "38 by distinct-4-gram ratio below 0.5,
    1 by a counting run" (the measures are in `degeneration.py`)."""
    names = {"distinct-4": f"distinct-4-gram ratio below {DISTINCT4_LOOP_THRESHOLD}",
             "repeated block": f"a block repeated back to back over >= {BLOCK_MIN_CHARS} characters",
             "counting run": f"a counting run of >= {COUNTING_MIN_TERMS} numbers"}
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
    return (f"**Skipped: {len(ids)} samples** whose prompt + CoT cap + answer cap exceed the model's context "
            f"({', '.join(map(str, contexts))} tokens); they are not in the tables: {shown}.")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:60] or "x"


def _plot_stem(model: str, benchmark: str, settings_key: str) -> str:
    """A plot's file stem: model, benchmark and a short hash of the run's settings.

    Why a hash and not the group's place in the report: numbered names shifted whenever a new
    run sorted before the others, so adding one run renamed every committed plot (forty files
    in one commit). Hashed, a run's plots keep their names for as long as its settings do."""
    digest = hashlib.sha1("\0".join((model, benchmark, settings_key)).encode()).hexdigest()[:8]  # slugs may collide
    return f"{_slug(model)}_{_slug(benchmark)}_{digest}"


# Numbered names (reports before session 16) and hashed ones: both are the report's own.
_PLOT_NAME = re.compile(r"(latency|budget)_(\d{2}_.+|.+_[0-9a-f]{8})\.png")


def _remove_previous_plots(out_dir: Path) -> None:
    """Delete plots an earlier report wrote here: a run no longer reported (or one whose
    settings changed) would leave its plots beside the report as if current."""
    for path in out_dir.glob("*.png"):
        if _PLOT_NAME.fullmatch(path.name):
            path.unlink()


def _exactness_by_source_lines(by_source: dict[str, dict[str, tuple[int, int]]]) -> list[str]:
    if len(by_source) < 2:
        return []
    modes = mode_order({m for per_mode in by_source.values() for m in per_mode})
    md = ["### Exact match by package source", "",
          "This run's records come from more than one version of the package (a resumed file spans code changes): "
          "records equal to their baseline / records compared, per source hash.", "",
          "| package source | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for source, per_mode in by_source.items():
        cells = [f"{per_mode[m][0]} / {per_mode[m][1]}" if m in per_mode else "–" for m in modes]
        md.append(f"| {source} | " + " | ".join(cells) + " |")
    return md + [""]


def _divergence_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    if not summary:
        return []
    md = ["### Where lossless modes left the baseline's tokens", "",
          "First differing token per record: its phase, and the forward shape (rows x tokens per row, as padded) that "
          "chose it in the mode and in the baseline (`forced`: appended by a policy; `?`: records written before "
          "shapes were recorded).", "",
          "| mode | left / compared | in CoT | in answer | shapes at the first difference (mode ← baseline: count) |",
          "|---|---|---|---|---|"]
    for mode, row in summary.items():
        shapes = ", ".join(f"{s['mode_shape']} ← {s['baseline_shape']}: {s['count']}" for s in row["shapes"][:4])
        md.append(f"| {mode} | {row['left_baseline']} / {row['compared']} | {row['in_cot']} | {row['in_answer']} | {shapes} |")
    return md + [""]


def build_report(inputs: list[Path], out_dir: Path) -> Path:
    """Write out_dir/report.md, out_dir/summary.json and the PNG plots; return report.md's path."""
    from selfspec_bench import plots

    records = load_records([Path(p) for p in inputs])
    skipped = [r for r in records if r["mode"] == SKIPPED]  # samples that did not fit the context
    records = [r for r in records if r["mode"] != SKIPPED]
    groups = group_records(records)
    skipped_by_group = _skipped_by_group(skipped)
    run_keys = {g.key for g in groups}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_previous_plots(out_dir)

    md = ["# selfspec bench report", "",
          f"Inputs: {', '.join(f'`{p}`' for p in inputs)} — {len(records)} records after deduplication.", "",
          "Speedup is the mean over samples of baseline latency / mode latency, paired per sample; latency "
          "reduction is 1 − mean mode latency / mean baseline latency over the same paired samples. "
          "Oracle speedup = (CoT + answer tokens) / (CoT tokens + 1), the ceiling if every answer token "
          "came free; *oracle realized* = (speedup − 1) / (oracle − 1). Modes that also speculate inside the "
          "CoT (suffix-decoding, prompt-lookup) can realize more than 100%: the oracle counts free answer "
          "tokens only. *Forced past end-of-text*: mean answer tokens after the model's own first "
          "end-of-text (fixed lengths go on to the cap; n/a for records written before this field existed). "
          "Pass rate grades the whole answer; where fixed lengths forced answers past the model's own "
          "end-of-text, it is also given for the answers cut there (what a user would have received).", ""]
    summary: dict[str, Any] = {"inputs": [str(p) for p in inputs], "n_records": len(records), "groups": []}
    comparison_md, summary["ours_beside_theirs"] = ours_beside_theirs(groups)
    md += comparison_md
    ablation_md, summary["reuse_ablation"] = ablation_section(groups, PAPER_ABLATION_SPEEDUP, LOOP_DOMINATED_SHARE)
    md += ablation_md

    for group in groups:
        stem = _plot_stem(group.model, group.benchmark, group.key[2])
        table = group.table()
        excluded = group.baseline_loop_samples()
        table_clean = group.table(exclude=set(excluded)) if excluded else table
        latency_png = plots.plot_latency_split(group.title, table, out_dir / f"latency_{stem}.png")
        meta = group.meta()
        timing = timing_check(group)
        group_skipped = skipped_by_group.get(group.key, [])
        md += [f"## {group.title}", "", f"Settings: {_settings_line(group.settings)}", ""]
        if group_skipped:
            md += [_skipped_sentence(group_skipped), ""]
        divergences = divergence_summary(group)
        by_source = exactness_by_source(group)
        positions = position_check(group)
        sharing = sharing_check(group)
        md += [markdown_table(table), "", *_timing_lines(timing), *_position_tables(group, positions), *_sharing_lines(sharing),
               *_divergence_lines(divergences), *_exactness_by_source_lines(by_source)]
        md += ["### Excluding samples whose baseline answer is a loop", "", _exclusion_sentence(group, excluded), ""]
        if excluded and table_clean:
            md += [markdown_table(table_clean), ""]
        elif excluded:
            md += ["Every sample was excluded: no table without loops for this run.", ""]
        beside = _paper_beside(group.benchmark)
        if beside:
            md += [beside, ""]
        md += [f"![latency split, {group.title}]({latency_png.name})", "", "Run metadata:", "", *_meta_lines(meta), ""]
        summary["groups"].append({
            "model": group.model, "benchmark": group.benchmark, "settings": group.settings,
            "n_samples": len({r["sample_id"] for r in group.records}),
            "modes": table, "excluded_loop_samples": excluded, "modes_excluding_loops": table_clean,
            "meta": meta, "plots": {"latency": latency_png.name}, "timing_check": timing,
            "run_position_check": {m: {str(p): v for p, v in per.items()} for m, per in positions.items()},
            "gpu_sharing_check": sharing,
            "skipped": [r["sample_id"] for r in group_skipped], "divergences": divergences,
            "exact_match_by_source": {src: {m: {"exact": e, "compared": n} for m, (e, n) in per.items()}
                                      for src, per in by_source.items()},
        })
    for key, entries in skipped_by_group.items():
        if key in run_keys:
            continue
        model, benchmark, _ = key
        md += [f"## {model} / {benchmark}: no sample fits", "", _skipped_sentence(entries), ""]
        summary["groups"].append({"model": model, "benchmark": benchmark, "settings": run_settings(entries[0]),
                                  "n_samples": 0, "skipped": [r["sample_id"] for r in entries]})

    md += ["## Speedup against draft budget", ""]
    summary["budget_plots"] = []
    for family in budget_families(groups):
        head = family[0]
        stem = _plot_stem(head.model, head.benchmark, settings_key(head.settings, drop=BUDGET_KEYS))
        png = plots.plot_speedup_vs_budget(head.label, _budget_series(family), _budget_series(family, no_loops=True),
                                           out_dir / f"budget_{stem}.png")
        budgets = sorted({g.settings.get("draft_budget") for g in family}, key=lambda b: (b is None, b or 0))
        md += [f"![speedup vs draft budget, {head.label}]({png.name})", "",
               f"{head.label}: draft budgets {', '.join(map(str, budgets))}"
               + (" (a single budget: one point per mode)." if len(budgets) == 1 else "."), ""]
        summary["budget_plots"].append({"model": head.model, "benchmark": head.benchmark, "plot": png.name,
                                        "draft_budgets": budgets})

    checks = concurrency_checks(groups)
    if checks:
        md += ["## Concurrency check: per-request speedups with one request at a time vs a shared batch", "",
               "Samples run both ways; each speedup is paired within its own run's baseline. Batched runs are "
               "trusted only where these agree within noise.", ""]
        for check in checks:
            md += [f"{check['label']} (concurrency 1 vs {check['concurrency']}, {check['n_common']} common samples):", "",
                   "| mode | speedup, one at a time | speedup, batched | difference |", "|---|---|---|---|"]
            for mode, row in check["modes"].items():
                md.append(f"| {mode} | {_fmt(row['single'], '.3f', 'x')} | {_fmt(row['batched'], '.3f', 'x')} | "
                          f"{_fmt(row['difference'], '+.3f')} |")
            md.append("")
        summary["concurrency_checks"] = checks

    reruns = rerun_checks(groups)
    md += _rerun_lines(reruns)
    summary["rerun_checks"] = reruns

    md += [paper_table(), ""]
    summary["paper"] = {"latency_reduction_pct": PAPER_LATENCY_REDUCTION_PCT, "ablation_gemma_classeval_speedup": PAPER_ABLATION_SPEEDUP}
    report_path = out_dir / "report.md"
    report_path.write_text("\n".join(md))
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return report_path


def _timing_lines(check: dict[str, Any]) -> list[str]:
    if not check["flagged"]:
        return []
    lines = ["**Timing check: some batches ran slower per forward than the rest of their mode** — their "
             "samples' paired speedups are suspect (e.g. a first timed run that paid for compilations):", ""]
    for f in check["flagged"]:
        lines.append(f"- {f['mode']}, batch {f['batch']} (samples {f['batch'] * check['concurrency']}–"
                     f"{(f['batch'] + 1) * check['concurrency'] - 1} in run order): {f['ms_per_forward']:.2f} ms per forward "
                     f"vs median {f['median_ms']:.2f}")
    return lines + [""]


def _position_tables(group: Group, everything: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """One place table, or two where a run's records differ in the per-sample warm-up (added
    against session 11's place-1 cost): the pair shows whether the warm-up removed it."""
    flags = {bool(r.get("group_warm_up")) for r in group.records if r.get("run_position")}
    if len(flags) < 2:
        return _position_lines(everything)
    return (_position_lines(position_check(group, warmed=False), " — samples without the per-sample warm-up")
            + _position_lines(position_check(group, warmed=True), " — samples with the per-sample warm-up"))


def _position_lines(check: dict[str, dict[int, dict[str, float]]], label: str = "") -> list[str]:
    positions = sorted({p for per in check.values() for p in per})
    if len(positions) < 2:
        return []
    lines = [f"### Time per forward by place in the run order{label}", "",
             "Median ms per forward (n) of each mode at each place in its sample's order; the order rotates from "
             "sample to sample, so a place that costs more shows as a column that is higher for every mode.", "",
             "| mode | " + " | ".join(f"place {p}" for p in positions) + " |",
             "|---|" + "---|" * len(positions)]
    for mode in mode_order(check):
        cells = [f"{check[mode][p]['median_ms_per_forward']:.3f} ({check[mode][p]['n']})" if p in check[mode] else "–"
                 for p in positions]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return lines + [""]


def _sharing_lines(check: dict[str, Any]) -> list[str]:
    if not check:
        return []
    conditions = [c for c in SHARING_CONDITIONS if c in check["samples"]]
    shared, total = check["samples"]["shared"], sum(check["samples"].values())
    effect = ("their forwards take longer, so the mean latencies above mix conditions" if shared < total else
              "forwards take longer than on a GPU of its own, so the mean latencies above are not those of a lone run")
    lines = ["### Runs that shared the GPU with other processes", "",
             f"{shared} of {total} samples ran while other processes used the same GPU (`gpu_co_tenants`): {effect}. "
             "Every mode of a sample ran under the same condition, so paired speedups compare like with like; "
             "this table shows whether sharing moved them. Cells: median ms per forward / mean paired speedup (n).", "",
             "| mode | " + " | ".join(f"{c} ({check['samples'][c]} samples)" for c in conditions) + " |",
             "|---|" + "---|" * len(conditions)]
    for mode in mode_order(check["modes"]):
        row = []
        for c in conditions:
            cell = check["modes"][mode].get(c)
            row.append("–" if not cell else f"{_fmt(cell['median_ms_per_forward'], '.3f')} / "
                                            f"{_fmt(cell['mean_speedup'], '.3f', 'x')} ({cell['n']})")
        lines.append(f"| {mode} | " + " | ".join(row) + " |")
    return lines + [""]


def _rerun_lines(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return []
    lines = ["## The same samples in a named run and in the unnamed run of the same settings", "",
             "Each cell: median ms per forward / mean paired speedup (each run paired with its own baseline); "
             "*same tokens*: samples whose output hash is equal in both runs.", ""]
    for c in checks:
        where = "; ".join(f"{'unnamed run' if side == 'reference' else 'run ' + c['run_name']}: "
                          + ", ".join(f"{n} {cond}" for cond, n in sorted(counts.items()))
                          for side, counts in c["sharing"].items())
        lines += [f"{c['label']}, unnamed run vs run {c['run_name']} ({c['n_common']} common samples; GPU — {where}):", "",
                  f"| mode | unnamed run | run {c['run_name']} | speedup difference | same tokens |", "|---|---|---|---|---|"]
        for mode, row in c["modes"].items():
            cells = [f"{_fmt(row[side]['median_ms_per_forward'], '.3f')} / "
                     + ("–" if mode == BASELINE else _fmt(row[side]['speedup'], '.3f', 'x')) for side in ("reference", "named")]
            a, b = row["reference"]["speedup"], row["named"]["speedup"]
            diff = "–" if None in (a, b) else f"{b - a:+.3f}"
            lines.append(f"| {mode} | {cells[0]} | {cells[1]} | {diff} | {row['same_tokens']} / {row['compared']} |")
        lines.append("")
    return lines


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
