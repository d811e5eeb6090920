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
import math
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from selfspec.bench.ablation import ablation_section
from selfspec.bench.modes import ALL_MODES, SKIPPED

Record = dict[str, Any]

BASELINE = "baseline"
# Settings that vary along the draft-budget sweep; the rest must match to share a plot.
BUDGET_KEYS = ("draft_budget", "draft_interval")

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


class ReportError(ValueError):
    """The inputs cannot make a report (no files, no records, a corrupt line)."""


# ---------------------------------------------------------------- loading


def load_records(inputs: Iterable[Path]) -> list[Record]:
    """All records of the inputs, deduplicated on (model, benchmark, sample, mode, settings).

    The last record of a key wins, so a re-run or a resumed file replaces older numbers.
    A bad *last* line is skipped (a bench run may be writing the file right now); a bad
    line anywhere else is an error, since silently dropping data would bias the means.
    """
    latest: dict[tuple, Record] = {}
    paths = list(inputs)
    if not paths:
        raise ReportError("no input files given")
    for path in paths:
        if not path.exists():
            raise ReportError(f"input file not found: {path}")
        lines = _read_text(path).splitlines()
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if lineno == len(lines):
                    continue  # a partial line still being written
                raise ReportError(f"{path}:{lineno}: not JSON ({exc})") from None
            if not isinstance(rec, dict) or "mode" not in rec or "sample_id" not in rec:
                raise ReportError(f"{path}:{lineno}: not a bench record (needs 'sample_id' and 'mode')")
            latest.pop(_record_key(rec), None)  # re-insert so order follows the latest write
            latest[_record_key(rec)] = rec
    if not latest:
        raise ReportError("no bench records in " + ", ".join(str(p) for p in paths))
    return list(latest.values())


def _read_text(path: Path) -> str:
    """A JSONL file, gzip-compressed or not: committed raw results are kept as .jsonl.gz
    (5-10x smaller) because the repository's tree travels to the GPU machine every call."""
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "rt") as handle:
            return handle.read()
    return path.read_text()


def model_label(rec: Record) -> str:
    """The model as tables name it: a local directory (a device run's `/tmp/out/.../adapter`)
    by its last component, so the report does not print where a run happened to keep it."""
    model = str(rec.get("model") or "unknown")
    return model.rstrip("/").rsplit("/", 1)[-1] if model.startswith(("/", "./", "../")) else model


def _record_key(rec: Record) -> tuple:
    return (model_label(rec), rec.get("benchmark"), rec["sample_id"], rec["mode"], _settings_key(_run_settings(rec)))


def _run_settings(rec: Record) -> dict[str, Any]:
    """The record's bench settings plus its dtype: runs of the same settings in fp32 and bf16
    are different measurements (other kernels, other step costs) and get their own tables."""
    settings = dict(rec.get("settings") or {})
    if rec.get("dtype") is not None:
        settings["dtype"] = rec["dtype"]
    return settings


def _settings_key(settings: dict[str, Any] | None, drop: tuple[str, ...] = ()) -> str:
    return json.dumps({k: v for k, v in (settings or {}).items() if k not in drop}, sort_keys=True)


# ---------------------------------------------------------------- statistics


def _mean(values: Iterable[Any]) -> float | None:
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(xs) / len(xs) if xs else None


def _rate(values: Iterable[Any]) -> float | None:
    xs = [bool(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def oracle_speedup(rec: Record) -> float | None:
    """The record's oracle speedup, or (CoT + answer) / (CoT + 1) from its token counts."""
    value = rec.get("oracle_speedup")
    if isinstance(value, (int, float)):
        return float(value)
    cot, answer = rec.get("cot_tokens"), rec.get("answer_tokens")
    if isinstance(cot, int) and isinstance(answer, int) and cot > 0:
        return (cot + answer) / (cot + 1)
    return None


def _answer_time(rec: Record) -> float | None:
    lat, think = rec.get("latency_s"), rec.get("thinking_s")
    if isinstance(lat, (int, float)) and isinstance(think, (int, float)):
        return lat - think
    return None


def _latency(rec: Record | None) -> float | None:
    lat = (rec or {}).get("latency_s")
    return float(lat) if isinstance(lat, (int, float)) and lat > 0 else None


def _ms_per_forward(rec: Record) -> float | None:
    """The run's latency per model forward in ms (the timing checks' unit); None without both."""
    forwards, latency = rec.get("forwards"), rec.get("latency_s")
    return 1e3 * latency / forwards if forwards and latency else None


def mode_stats(records: list[Record], baseline: dict[str, Record]) -> dict[str, Any]:
    """One table row: the mode's records against the baseline records keyed by sample id.

    Speedup is the mean over samples of baseline_latency / mode_latency (paired), and the
    latency reduction uses the same paired samples, so a mode that only ran on the easy
    half of a benchmark cannot look faster than it is.
    """
    pairs = [(b, m) for rec in records if (m := _latency(rec)) and (b := _latency(baseline.get(rec["sample_id"])))]
    speedup = _mean(b / m for b, m in pairs)
    reduction = None
    if pairs:
        reduction = 100.0 * (1.0 - _mean(m for _, m in pairs) / _mean(b for b, _ in pairs))
    oracle = _mean(oracle_speedup(r) for r in records)
    realized = None
    if speedup is not None and oracle is not None and oracle > 1.0:
        realized = (speedup - 1.0) / (oracle - 1.0)
    scored = [r.get("passed") for r in records if r.get("passed") is not None]
    # Fixed lengths force answers past the model's own end-of-text: graded cut there too
    # (`bench.end_of_text`); records from before that field have none.
    scored_at_eos = [r.get("passed_at_eos") for r in records if r.get("passed_at_eos") is not None]
    return {
        "n": len(records),
        "n_paired": len(pairs),
        "mean_latency_s": _mean(r.get("latency_s") for r in records),
        "mean_thinking_s": _mean(r.get("thinking_s") for r in records),
        "mean_answer_s": _mean(_answer_time(r) for r in records),
        "speedup": speedup,
        "latency_reduction_pct": reduction,
        "mean_accepted_prefix": _mean(r.get("accepted_prefix") for r in records),
        "mean_suffix_accepted_tokens": _mean(r.get("suffix_accepted_tokens") for r in records),
        "mean_acceptance_length": _mean(r.get("mean_acceptance_length") for r in records),
        "mean_first_answer_token_s": _mean(r.get("first_answer_token_s") for r in records),
        "mean_oracle_speedup": oracle,
        "oracle_fraction": realized,
        "exact_match_rate": _rate(r.get("exact_match") for r in records),
        "pass_rate": _rate(scored),
        "n_scored": len(scored),
        "pass_rate_at_eos": _rate(scored_at_eos),
        "n_scored_at_eos": len(scored_at_eos),
        "mean_forced_past_eos": _mean(r.get("forced_past_eos") for r in records),
        "loops": sum(1 for r in records if r.get("loop") is True),
        # Natural lengths: a model may end (EOS) while still thinking, so there is no answer to
        # draft or verify and no first answer token; such runs are counted, not hidden.
        "no_answer": sum(1 for r in records if r.get("answer_tokens") == 0),
    }


def mode_order(modes: Iterable[str]) -> list[str]:
    """Baseline first, then the CLI's order of modes, then any unknown ones alphabetically."""
    known = {m: i for i, m in enumerate(ALL_MODES)}
    return sorted(set(modes), key=lambda m: (m != BASELINE, known.get(m, len(known)), m))


@dataclass
class Group:
    """Records of one model x benchmark x settings: the unit a table is drawn for."""

    model: str
    benchmark: str
    settings: dict[str, Any]
    records: list[Record] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        """The `_group_key` its records share."""
        return self.model, self.benchmark, _settings_key(self.settings)

    @property
    def label(self) -> str:
        return f"{self.model} / {self.benchmark}"

    @property
    def title(self) -> str:
        """The label plus the draft budget, which tells apart the tables of a budget sweep, the
        dtype and a run's name (`bench --run-name`), which tell apart runs of the same knobs."""
        budget = self.settings.get("draft_budget")
        title = self.label if budget is None else f"{self.label}, draft budget {budget}"
        dtype = self.settings.get("dtype")
        title = title if dtype is None else f"{title}, {dtype}"
        run_name = self.settings.get("run_name")
        return title if not run_name else f"{title}, run {run_name}"

    def by_mode(self, exclude: set[str] = frozenset()) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = defaultdict(list)
        for rec in self.records:
            if rec["sample_id"] not in exclude:
                out[rec["mode"]].append(rec)
        return {m: out[m] for m in mode_order(out)}

    def by_sample(self) -> dict[str, list[Record]]:
        out: dict[str, list[Record]] = defaultdict(list)
        for rec in self.records:
            out[rec["sample_id"]].append(rec)
        return dict(out)

    def baseline_count(self) -> int:
        """Samples with a baseline record: the n that loop and no-answer shares are taken of."""
        return len({r["sample_id"] for r in self.records if r["mode"] == BASELINE})

    def baseline_loop_samples(self) -> list[str]:
        return sorted({r["sample_id"] for r in self.records if r["mode"] == BASELINE and r.get("loop") is True})

    def table(self, exclude: set[str] = frozenset()) -> dict[str, dict[str, Any]]:
        modes = self.by_mode(exclude)
        baseline = {r["sample_id"]: r for r in modes.get(BASELINE, [])}
        return {mode: mode_stats(recs, baseline) for mode, recs in modes.items()}

    def meta(self) -> dict[str, list[Any]]:
        """Distinct device, dtype, date, versions and commands, in first-seen order."""
        out: dict[str, list[Any]] = {}
        for key in ("device", "dtype", "date", "versions", "command"):
            seen: list[Any] = []
            for rec in self.records:
                value = rec.get(key)
                if value is not None and value not in seen:
                    seen.append(value)
            out[key] = seen
        return out


def _group_key(rec: Record) -> tuple[str, str, str]:
    """(model, benchmark, settings key): the unit a table is drawn for (`Group`)."""
    return model_label(rec), str(rec.get("benchmark") or "unknown"), _settings_key(_run_settings(rec))


def group_records(records: list[Record]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for rec in records:
        key = _group_key(rec)
        if key not in groups:
            groups[key] = Group(key[0], key[1], _run_settings(rec))
        groups[key].records.append(rec)
    return sorted(groups.values(), key=lambda g: g.key)


def budget_families(groups: list[Group]) -> list[list[Group]]:
    """Groups that differ only in the draft budget (and interval): one speedup-vs-budget plot each."""
    families: dict[tuple, list[Group]] = defaultdict(list)
    for g in groups:
        families[(g.model, g.benchmark, _settings_key(g.settings, drop=BUDGET_KEYS))].append(g)
    return list(families.values())


# ---------------------------------------------------------------- markdown


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


def _verdict(ours_pct: float | None, row: str | None) -> str:
    """How our latency reduction stands against the paper's two models on the same row."""
    if row is None:
        return "no paper row"
    if ours_pct is None:
        return "n/a"
    theirs = PAPER_LATENCY_REDUCTION_PCT[row]
    beaten = [m for m in PAPER_MODELS if ours_pct >= theirs[m]]
    if len(beaten) == len(PAPER_MODELS):
        return "matches or beats both"
    if beaten:
        return f"matches or beats {beaten[0]} only"
    return "below both"


LOOP_DOMINATED_SHARE = 0.5  # above this share of loop baselines, a run's all-sample number is not a paper-row answer


def _verdict_all_samples(ours_pct: float | None, row: str | None, samples: int, *, loops: int = 0,
                         no_answer: int = 0) -> str:
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
    return _verdict(ours_pct, row)


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
            "verdict": _verdict_all_samples(ours["latency_reduction_pct"], row, baselines, loops=len(excluded),
                                            no_answer=no_answer),
            "verdict_without_loops": (_verdict_all_samples(clean["latency_reduction_pct"], row, baselines - len(excluded),
                                                           no_answer=clean_no_answer) if clean else "n/a"),
        })
    if not rows:
        return [], rows
    md = ["## Full SSR (prefix+suffix): ours beside the paper's rows", "",
          "Latency reduction against the baseline of the same run; the paper's numbers (patched vLLM, 4B models) "
          "are theirs. Runs on our own thinker workload have no paper row. Where more than half of a run's "
          "baselines are loops, its all-sample number gets no verdict: a draft that repeats the baseline's loop "
          "is accepted for free; likewise where more than half end inside thinking with no answer (natural lengths). "
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
                  f"| {r['baseline_no_answer']} | {_fmt(r['latency_reduction_pct'], '.1f', '%')} "
                  f"| {_fmt(r['latency_reduction_pct_without_loops'], '.1f', '%')} ({r['n_without_loops']}) "
                  f"| {_fmt(r['accepted_prefix'], '.1f')} | {_pct(r['exact_match_rate'])} | {_sharing_cell(r['gpu_sharing'])} "
                  f"| {theirs} "
                  f"| {r['verdict']} / {r['verdict_without_loops']} |")
    return md + [""], rows


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
    return (
        f"{len(excluded)} of {len(samples)} samples excluded because their baseline answer is a loop "
        "(distinct-4-gram ratio below 0.5): small models forced past EOS at a fixed answer length fall "
        "into repetition, and a draft that repeats the same loop \"matches\" almost for free, which "
        "flatters every draft mode." + (f" Excluded: {', '.join(excluded)}." if excluded else "")
    )


# ---------------------------------------------------------------- build


def _skipped_by_group(skipped: list[Record]) -> dict[tuple, list[Record]]:
    out: dict[tuple, list[Record]] = defaultdict(list)
    for rec in skipped:
        out[_group_key(rec)].append(rec)
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
            (str(r.get("first_divergence_shape", "?")).split("/")[0], str(r.get("baseline_shape_at_divergence", "?")).split("/")[0])
            for r in left)
        out[mode] = {
            "compared": len(recs), "left_baseline": len(left),
            "in_cot": sum(r.get("first_divergence_phase") == "cot" for r in left),
            "in_answer": sum(r.get("first_divergence_phase") == "answer" for r in left),
            "shapes": [{"mode_shape": m, "baseline_shape": b, "count": n} for (m, b), n in pairs.most_common()],
        }
    return out


def exactness_by_source(group: Group) -> dict[str, dict[str, tuple[int, int]]]:
    """Per package source hash (`versions.selfspec_source`; "before hashes" for older records),
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
    from selfspec.bench import plots

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
        summary["groups"].append({"model": model, "benchmark": benchmark, "settings": _run_settings(entries[0]),
                                  "n_samples": 0, "skipped": [r["sample_id"] for r in entries]})

    md += ["## Speedup against draft budget", ""]
    summary["budget_plots"] = []
    for family in budget_families(groups):
        head = family[0]
        stem = _plot_stem(head.model, head.benchmark, _settings_key(head.settings, drop=BUDGET_KEYS))
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
        ms = _ms_per_forward(rec)
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


def position_check(group: Group, warmed: bool | None = None) -> dict[str, dict[int, dict[str, float]]]:
    """Median time per forward of each mode at each place in its sample's run order.

    Why: session 10 found the baseline, then always first, ~9% slower per forward than the same
    steps run later (H200, half-second requests), which flattered every other mode. The runner
    now rotates every mode through every place and records `run_position`; this table shows
    whether a place still costs something (a mode slower in one place than in the others).
    Empty for records written before `run_position` existed. `warmed`: only records whose
    sample had (True) or had not (False) short untimed runs before its timed ones.
    """
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in group.records:
        if warmed is not None and bool(rec.get("group_warm_up")) != warmed:
            continue
        position, ms = rec.get("run_position"), _ms_per_forward(rec)
        if position and ms is not None:
            cells[rec["mode"]][int(position)].append(ms)
    return {mode: {pos: {"n": len(v), "median_ms_per_forward": statistics.median(v)} for pos, v in sorted(per.items())}
            for mode, per in cells.items()}


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


def sharing_check(group: Group) -> dict[str, Any]:
    """Per-mode time per forward and paired speedup of samples that ran alone on their GPU,
    beside those that shared it with other processes (and those that did not record it).

    Why: session 13 had one GPU and ran two queues on it; every forward took 1.7-2.1x as long
    as session 12's on a GPU of its own, so a table that mixes both holds mean latencies of two
    conditions. Every mode of a sample runs in one process back to back, yet sharing still moves
    paired speedups: it slows one-token forwards more than verify forwards, so the speculative
    modes read faster shared (session 14, the same 8 samples: prompt lookup 4.30x shared, 3.61x
    alone). Empty unless some record says it shared the GPU."""
    condition = sample_sharing(group)
    if "shared" not in condition.values():
        return {}
    baseline = {r["sample_id"]: r for r in group.records if r["mode"] == BASELINE}
    cells: dict[str, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for rec in group.records:
        cells[rec["mode"]][condition[rec["sample_id"]]].append(rec)

    def cell(recs: list[Record]) -> dict[str, Any]:
        ms = [m for m in map(_ms_per_forward, recs) if m is not None]
        speedups = [base / lat for r in recs
                    if (base := _latency(baseline.get(r["sample_id"]))) and (lat := _latency(r))]
        return {"n": len(recs), "median_ms_per_forward": statistics.median(ms) if ms else None,
                "mean_speedup": statistics.fmean(speedups) if speedups else None}

    table = {mode: {cond: cell(recs) for cond, recs in per.items()} for mode, per in cells.items()}
    counts = {cond: sum(1 for c in condition.values() if c == cond) for cond in SHARING_CONDITIONS}
    return {"samples": {c: n for c, n in counts.items() if n}, "modes": table}


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


def concurrency_checks(groups: list[Group]) -> list[dict[str, Any]]:
    """Pairs of runs that differ only in `concurrency` (1 vs N): per-mode speedups on their common samples."""
    by_key: dict[tuple, dict[int, Group]] = defaultdict(dict)
    for g in groups:
        key = (g.model, g.benchmark, _settings_key(g.settings, drop=("concurrency",)))
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
                    base = {r["sample_id"]: r for r in group.records if r["mode"] == BASELINE and r["sample_id"] in common}
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

    Why: a named run that reruns samples of a committed one under another condition (session
    14's `alone-check`: samples session 13 ran on a shared GPU, again with the GPU to itself)
    answers a question the sharing table cannot — the same samples, so any difference is the
    condition's or noise, not the samples'. Runs that share no sample are left out."""
    by_key: dict[tuple, dict[str | None, Group]] = defaultdict(dict)
    for g in groups:
        by_key[(g.model, g.benchmark, _settings_key(g.settings, drop=("run_name",)))][g.settings.get("run_name")] = g
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
            recs = {side: {(r["sample_id"], r["mode"]): r for r in g.records if r["sample_id"] in common}
                    for side, g in sides.items()}
            modes: dict[str, dict[str, Any]] = {}
            shared_modes = {m for (_, m) in recs["reference"]} & {m for (_, m) in recs["named"]}
            for mode in mode_order(shared_modes):
                row: dict[str, Any] = {}
                for side in sides:
                    mine = [r for (sid, m), r in recs[side].items() if m == mode]
                    base = {sid: r for (sid, m), r in recs[side].items() if m == BASELINE}
                    ms = [m for m in map(_ms_per_forward, mine) if m is not None]
                    row[side] = {"n": len(mine), "median_ms_per_forward": statistics.median(ms) if ms else None,
                                 "speedup": None if mode == BASELINE else mode_stats(mine, base)["speedup"]}
                pairs = [(recs["reference"][(sid, mode)], recs["named"][(sid, mode)]) for sid in sorted(common)
                         if (sid, mode) in recs["reference"] and (sid, mode) in recs["named"]]
                row["same_tokens"] = sum(1 for a, b in pairs if a.get("output_hash") and a.get("output_hash") == b.get("output_hash"))
                row["compared"] = len(pairs)
                modes[mode] = row
            sharing = {}
            for side, by_pair in recs.items():
                per_sample: dict[str, list[Record]] = defaultdict(list)
                for (sid, _), r in by_pair.items():
                    per_sample[sid].append(r)
                sharing[side] = dict(Counter(_sample_sharing(rs) for rs in per_sample.values()))
            checks.append({"label": reference.label, "run_name": name, "n_common": len(common), "modes": modes,
                           "sharing": sharing})
    return checks


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
