"""Evaluate a thinker: task accuracy, self-termination, loops, and the convergence curve.

SSR pays off only when a model's answer takes shape while it thinks. This eval measures
that directly, for our trained thinker or any model a user loads (the measures are
defined in `thinker.measures`; the files are written by `thinker.eval_report`):

1. **Natural runs.** Held-out items (another seed of the same generators) are decoded
   greedily with thinking on, the model's own end-of-thinking marker and EOS honoured,
   under generous caps. Per family: accuracy (the family's checker), the share of runs
   that closed thinking themselves *and* stopped at EOS, and loops.
2. **Loops and repetition.** A run "loops" when it hits a cap instead of stopping, or
   when its tokens hold an exactly periodic stretch. The same detector runs on the
   reference traces, where it must find nothing, and the distinct-4-gram ratio of
   outputs is reported next to the references' (structured CoTs repeat phrases by
   design; the ratio says whether the model repeats more than its training data does).
3. **Convergence curve.** For every run whose CoT ended by itself and whose answer ended
   at EOS, drafts are forked at fractions of the CoT: context = prompt + the first
   `round(x * cot_tokens)` CoT tokens + the format's close tokens (exactly what SSR's
   fork appends), decoded greedily. Each draft is compared with the run's final answer
   (both without leading whitespace tokens and EOS): their common prefix and the share
   of the answer that draft-backed suffix lookup predicts. A draft that rambles past the
   answer's length offers more to match, so the same measure is also taken with the
   draft cut to the final answer's length.

   Fork point 0.0 (no CoT at all) is the baseline the curve must rise from, and an
   *unrelated-answer control* (another item's reference answer used as the draft)
   shows how much the families' answer templates alone make predictable.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from selfspec import SamplingParams, ThinkingLimits
from selfspec.thinking.format import split_reasoning
from selfspec_bench.degeneration import distinct_ngram_ratio
from selfspec_research.thinker.data_versions import HELDOUT_SEED
from selfspec_research.thinker.examples import DataSpec
from selfspec_research.thinker.measures import (
    LOOP_MIN_SPAN,
    common_prefix_len,
    convergence_table,
    family_summaries,
    has_loop,
    longest_periodic_span,
    strip_answer,
    suffix_predicted_tokens,
    summarize_records,
    template_control,
)
from selfspec_research.thinker.tasks import TaskItem, check_many, format_training_text

FORK_POINTS: tuple[float, ...] = (0.0, 0.10, 0.25, 0.50, 0.75, 0.90)
"""0.0 forks before any CoT token: the no-thinking baseline the other points must beat."""


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and under which limits (recorded in results.json)."""

    data: DataSpec = field(default_factory=lambda: DataSpec(seed=HELDOUT_SEED, items_per_family=40))
    cot_cap: int = 2500
    answer_cap: int = 1000
    fork_points: tuple[float, ...] = FORK_POINTS
    convergence_items_per_family: int | None = 20  # None: every eligible run
    draft_cap: int = 768

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["data"] = self.data.describe()
        return data


# --------------------------------------------------------------------------- running


@dataclass
class _Run:
    """One natural run, reduced to what the metrics need."""

    item: TaskItem
    prompt_ids: list[int]
    output_ids: list[int]
    cot_offset: int  # output tokens before the CoT (a native model's own start marker)
    cot_len: int
    answer_ids: list[int]
    record: dict[str, Any]


def _cot_bounds(output_ids: Sequence[int], fmt: Any) -> tuple[int, int]:
    """(offset, length) of the CoT inside the output, end marker excluded."""
    start = list(fmt.start_ids)
    offset = len(start) if start and list(output_ids[: len(start)]) == start else 0
    reasoning, _ = split_reasoning(output_ids, fmt, starts_in_thinking=True)
    return offset, len(reasoning)


def run_eval(
    llm: Any,
    config: EvalConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the whole eval on `llm` (a `selfspec.llm.LLM`); return the results dict.

    The results hold the config, per-family and overall summaries, the convergence
    table and one record per item (so any number can be recomputed from the file).
    """
    tokenizer, fmt = llm.tokenizer, llm.thinking_format
    if fmt is None or not fmt.thinks:
        raise ValueError("the model has no thinking format: nothing to evaluate")
    eos_ids = llm.engine.eos_token_ids
    items = config.data.items()
    log(f"eval: {len(items)} held-out items ({config.data.version}, seed {config.data.seed})")

    started = time.perf_counter()
    limits = ThinkingLimits(cot_cap=config.cot_cap, answer_cap=config.answer_cap)
    params = SamplingParams(max_tokens=config.cot_cap + config.answer_cap + len(fmt.close_ids) + 8, temperature=0.0)
    prompts = [format_training_text(item)[0] for item in items]
    outputs = llm.generate(prompts, params, limits=limits, thinking=True, progress=progress, spec=None)
    generate_seconds = time.perf_counter() - started
    verdicts = check_many(items, [out.answer_text or "" for out in outputs])

    runs: list[_Run] = []
    for item, out, verdict in zip(items, outputs, verdicts):
        offset, cot_len = _cot_bounds(out.token_ids, fmt)
        closed_by = out.metrics.get("thinking_closed_by", "")
        self_stopped = closed_by == "model" and out.finish_reason == "stop" and out.finish_detail == "eos"
        period, span = longest_periodic_span(out.token_ids)
        record = {
            "uid": item.uid,
            "family": item.family,
            "passed": verdict.passed,
            "score": round(verdict.score, 4),
            "detail": verdict.detail[:300],
            "cot_tokens": out.metrics.get("cot_tokens", cot_len),
            "answer_tokens": out.metrics.get("answer_tokens", 0),
            "thinking_closed_by": closed_by,
            "finish": f"{out.finish_reason}:{out.finish_detail}",
            "self_stopped": self_stopped,
            "periodic_span": span,
            "periodic_period": period,
            "loop": (span >= LOOP_MIN_SPAN) or not self_stopped,
            "distinct4": round(distinct_ngram_ratio(out.token_ids), 4),
            "answer_excerpt": (out.answer_text or "")[:240],
        }
        answer = strip_answer(out.answer_token_ids or [], tokenizer, eos_ids)
        runs.append(_Run(item, list(out.prompt_token_ids), list(out.token_ids), offset, cot_len, answer, record))
    log(f"natural runs: {generate_seconds:.1f}s; passed {sum(r.record['passed'] for r in runs)}/{len(runs)}")

    references = _reference_repetition(tokenizer, items)
    drafts_started = time.perf_counter()
    convergence_rows = _convergence(llm, runs, config, eos_ids, progress)
    draft_seconds = time.perf_counter() - drafts_started
    log(f"drafts: {draft_seconds:.1f}s")

    records = [run.record for run in runs]
    return {
        "config": config.describe(),
        "model": getattr(llm, "model_name", "custom"),
        "thinking_format": {
            "kind": fmt.kind,
            "start": fmt.start_marker,
            "end": fmt.end_marker,
            "close_ids": list(fmt.close_ids),
        },
        "seconds": {"natural_runs": round(generate_seconds, 2), "drafts": round(draft_seconds, 2)},
        "families": family_summaries(records, references),
        "overall": summarize_records(records, [ref for refs in references.values() for ref in refs]),
        "convergence": convergence_table(convergence_rows, config.fork_points, config.draft_cap),
        "template_control": template_control(tokenizer, fmt, items),
        "checks": {},
        "records": records,
        "draft_records": convergence_rows,
    }


def _reference_repetition(tokenizer: Any, items: Sequence[TaskItem]) -> dict[str, list[dict[str, float]]]:
    """Loop detector and distinct-4 ratio on the reference traces (the detector's control)."""
    by_family: dict[str, list[dict[str, float]]] = defaultdict(list)
    for item in items:
        ids = tokenizer.encode(f"{item.cot}\n</think>\n\n{item.answer}", add_special_tokens=False)
        by_family[item.family].append(
            {
                "loop": float(has_loop(ids)),
                "distinct4": distinct_ngram_ratio(ids),
                "cot_tokens": len(tokenizer.encode(item.cot, add_special_tokens=False)),
            }
        )
    return by_family


def _convergence(
    llm: Any, runs: Sequence[_Run], config: EvalConfig, eos_ids: frozenset[int], progress: bool
) -> list[dict[str, Any]]:
    """Fork drafts from finished runs' CoTs and compare them with the final answers."""
    fmt, tokenizer = llm.thinking_format, llm.tokenizer
    eligible: dict[str, list[_Run]] = defaultdict(list)
    for run in runs:
        if run.record["self_stopped"] and run.cot_len > 0 and run.answer_ids:
            eligible[run.item.family].append(run)
    chosen = [run for family_runs in eligible.values() for run in family_runs[: config.convergence_items_per_family]]
    jobs: list[tuple[_Run, float, int]] = []
    contexts: list[list[int]] = []
    for run in chosen:
        for point in config.fork_points:
            cut = round(point * run.cot_len)
            jobs.append((run, point, cut))
            contexts.append(run.prompt_ids + run.output_ids[: run.cot_offset + cut] + list(fmt.close_ids))
    if not jobs:
        return []
    params = SamplingParams(max_tokens=config.draft_cap, temperature=0.0)
    outputs = llm.generate(contexts, params, thinking=False, progress=progress, spec=None)
    verdicts = check_many([run.item for run, _, _ in jobs], [out.text for out in outputs])
    rows = []
    for (run, point, cut), out, verdict in zip(jobs, outputs, verdicts):
        draft = strip_answer(out.token_ids, tokenizer, eos_ids)
        final = run.answer_ids
        prefix = common_prefix_len(draft, final)
        predicted = suffix_predicted_tokens(final, draft, fmt.close_ids)
        # A draft that rambles past the answer's length offers more n-grams to match:
        # the capped variant sees only as many draft tokens as the final answer has.
        predicted_capped = suffix_predicted_tokens(final, draft[: len(final)], fmt.close_ids)
        rows.append(
            {
                "uid": run.item.uid,
                "family": run.item.family,
                "point": point,
                "cot_tokens_seen": cut,
                "draft_tokens": len(draft),
                "final_tokens": len(final),
                "common_prefix": prefix,
                "prefix_share": round(prefix / len(final), 4),
                "predicted_tokens": predicted,
                "predictable_share": round(predicted / len(final), 4),
                "predictable_share_capped": round(predicted_capped / len(final), 4),
                "draft_passed": verdict.passed,
            }
        )
    return rows


__all__ = ["EvalConfig", "FORK_POINTS", "run_eval"]
