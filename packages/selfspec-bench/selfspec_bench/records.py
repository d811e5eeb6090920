"""Bench records as runs: loading JSONL, per-mode statistics, and the groups a report draws.

A run is one model x benchmark x settings; every figure about it pairs a mode's record with the
plain-greedy baseline of the same sample in the same run. `report.py` presents these groups,
`run_checks.py` checks that their pairs compare like with like, `paper.py` and `ablation.py`
set them beside the paper's numbers; this module is what they all share.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from scipy.stats import bootstrap

from selfspec_bench.degeneration import loop_kind
from selfspec_bench.jsonl import JsonlError, iter_jsonl
from selfspec_bench.modes import ALL_MODES

Record = dict[str, Any]

BASELINE = "baseline"
# Settings that vary along the draft-budget sweep; the rest must match to share a plot.
BUDGET_KEYS = ("draft_budget", "draft_interval")


class ReportError(ValueError):
    """The inputs cannot make a report (no files, no records, a corrupt line)."""


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
    for path in map(Path, paths):
        if not path.exists():
            raise ReportError(f"input file not found: {path}")
        for lineno, rec in _read_records(path):
            if not isinstance(rec, dict) or "mode" not in rec or "sample_id" not in rec:
                raise ReportError(f"{path}:{lineno}: not a bench record (needs 'sample_id' and 'mode')")
            latest.pop(_record_key(rec), None)  # re-insert so order follows the latest write
            latest[_record_key(rec)] = rec
    if not latest:
        raise ReportError("no bench records in " + ", ".join(str(p) for p in paths))
    for rec in latest.values():
        _judge_loop(rec)
    return list(latest.values())


def _judge_loop(rec: Record) -> None:
    """Re-judge the loop flag with today's measures (`degeneration.py`), so records written
    before a measure existed are set apart the same way as new ones."""
    if "loop" in rec or "answer_text" in rec:
        rec["loop_kind"] = loop_kind(rec)
        rec["loop"] = rec["loop_kind"] is not None


def _read_records(path: Path) -> list[tuple[int, Any]]:
    """(line number, value) of a records file, plain or .jsonl.gz; a bad last line is one still being written."""
    try:
        return list(iter_jsonl(path, bad_lines="skip-last"))
    except JsonlError as exc:
        raise ReportError(str(exc)) from None


def model_label(rec: Record) -> str:
    """The model as tables name it: a local directory (a device run's `/tmp/out/.../adapter`)
    by its last component, so the report does not print where a run happened to keep it."""
    model = str(rec.get("model") or "unknown")
    return model.rstrip("/").rsplit("/", 1)[-1] if model.startswith(("/", "./", "../")) else model


def _record_key(rec: Record) -> tuple:
    return (model_label(rec), rec.get("benchmark"), rec["sample_id"], rec["mode"], settings_key(run_settings(rec)))


def run_settings(rec: Record) -> dict[str, Any]:
    """The record's bench settings plus its dtype: runs of the same settings in fp32 and bf16
    are different measurements (other kernels, other step costs) and get their own tables."""
    settings = dict(rec.get("settings") or {})
    if rec.get("dtype") is not None:
        settings["dtype"] = rec["dtype"]
    return settings


def settings_key(settings: dict[str, Any] | None, drop: tuple[str, ...] = ()) -> str:
    return json.dumps({k: v for k, v in (settings or {}).items() if k not in drop}, sort_keys=True)


def _mean(values: Iterable[Any]) -> float | None:
    """Mean of the finite numbers among `values` (records leave fields out or None); None if there are none."""
    xs = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.fmean(xs) if xs else None


def _rate(values: Iterable[Any]) -> float | None:
    """Share of true values among those recorded (None: not recorded); None if none are."""
    xs = [bool(v) for v in values if v is not None]
    return statistics.fmean(xs) if xs else None


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


def latency_of(rec: Record | None) -> float | None:
    lat = (rec or {}).get("latency_s")
    return float(lat) if isinstance(lat, (int, float)) and lat > 0 else None


def ms_per_forward(rec: Record) -> float | None:
    """The run's latency per model forward in ms (the timing checks' unit); None without both."""
    forwards, latency = rec.get("forwards"), rec.get("latency_s")
    return 1e3 * latency / forwards if forwards and latency else None


BOOTSTRAP_RESAMPLES = 2000


def latency_reduction_ci(
    pairs: list[tuple[float, float]], level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the paired latency reduction (1 - sum mode / sum baseline, in %).

    Why: the verdicts against the paper rest on a handful of loop-free samples in some runs (five
    of SmolLM2's 164 HumanEval samples), where one slow sample moves the mean by points; the
    interval says how far. `paired=True` resamples whole samples, keeping each mode latency with
    its baseline. Percentile, not BCa: BCa has no interval where every resample gives the same
    reduction (a mode that saves the same share on every sample). Seeded, so a rebuilt report is
    identical. None below two pairs."""
    return paired_bootstrap_ci(pairs, _latency_reduction_pct, level=level, resamples=resamples, seed=seed)


def paired_bootstrap_ci(
    pairs: list[tuple[float, float]],
    statistic,
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of a vectorized `statistic(a, b, axis)` over paired samples,
    resampling whole pairs (seeded: a rebuilt report is identical). None below two pairs."""
    if len(pairs) < 2:
        return None
    first, second = np.asarray(pairs, dtype=np.float64).T
    result = bootstrap(
        (first, second),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _latency_reduction_pct(baseline: np.ndarray, mode: np.ndarray, axis: int = -1) -> np.ndarray:
    return 100.0 * (1.0 - mode.sum(axis=axis) / baseline.sum(axis=axis))


def mode_stats(records: list[Record], baseline: dict[str, Record]) -> dict[str, Any]:
    """One table row: the mode's records against the baseline records keyed by sample id.

    Speedup is the mean over samples of baseline_latency / mode_latency (paired), and the
    latency reduction uses the same paired samples, so a mode that only ran on the easy
    half of a benchmark cannot look faster than it is.
    """
    pairs = [(b, m) for rec in records if (m := latency_of(rec)) and (b := latency_of(baseline.get(rec["sample_id"])))]
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
    # (`end_of_text.py`); records without that field have none.
    scored_at_eos = [r.get("passed_at_eos") for r in records if r.get("passed_at_eos") is not None]
    return {
        "n": len(records),
        "n_paired": len(pairs),
        "mean_latency_s": _mean(r.get("latency_s") for r in records),
        "mean_thinking_s": _mean(r.get("thinking_s") for r in records),
        "mean_answer_s": _mean(_answer_time(r) for r in records),
        "speedup": speedup,
        "latency_reduction_pct": reduction,
        "latency_reduction_ci95": latency_reduction_ci(pairs),
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
        """The `group_key` its records share."""
        return self.model, self.benchmark, settings_key(self.settings)

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


def group_key(rec: Record) -> tuple[str, str, str]:
    """(model, benchmark, settings key): the unit a table is drawn for (`Group`)."""
    return model_label(rec), str(rec.get("benchmark") or "unknown"), settings_key(run_settings(rec))


def group_records(records: list[Record]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for rec in records:
        key = group_key(rec)
        if key not in groups:
            groups[key] = Group(key[0], key[1], run_settings(rec))
        groups[key].records.append(rec)
    return sorted(groups.values(), key=_group_order)


def _group_order(group: Group) -> tuple:
    """Tables in a stable order, a budget sweep's by budget as a number (50 before 100,
    which sorting the settings' JSON text would put the other way round)."""
    budget = group.settings.get("draft_budget")
    numeric = isinstance(budget, (int, float)) and not isinstance(budget, bool)
    return group.model, group.benchmark, not numeric, budget if numeric else 0, group.key[2]


def budget_families(groups: list[Group]) -> list[list[Group]]:
    """Groups that differ only in the draft budget (and interval): one speedup-vs-budget plot each."""
    families: dict[tuple, list[Group]] = defaultdict(list)
    for g in groups:
        families[(g.model, g.benchmark, settings_key(g.settings, drop=BUDGET_KEYS))].append(g)
    return list(families.values())
