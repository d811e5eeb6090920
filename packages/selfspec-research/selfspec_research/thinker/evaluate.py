"""Evaluate a thinker: task accuracy, self-termination, loops, and the convergence curve.

SSR pays off only when a model's answer takes shape while it thinks. This eval measures
that directly, for our trained thinker or any model a user loads:

1. **Natural runs.** Held-out items (another seed of the same generators) are decoded
   greedily with thinking on, the model's own end-of-thinking marker and EOS honoured,
   under generous caps. Per family: accuracy (the family's checker), the share of runs
   that closed thinking themselves *and* stopped at EOS, and loops.
2. **Loops and repetition.** A run "loops" when it hits a cap instead of stopping, or
   when its tokens hold an exactly periodic stretch (a block of at most 256 tokens
   repeated at least 3 times, spanning at least 64 tokens): a greedy small model stuck
   in a cycle. The same detector runs on the reference traces, where it must find
   nothing, and the distinct-4-gram ratio of outputs is reported next to the
   references' (structured CoTs repeat phrases by design; the ratio says whether the
   model repeats more than its training data does).
3. **Convergence curve.** For every run whose CoT ended by itself and whose answer ended
   at EOS, drafts are forked at fractions of the CoT: context = prompt + the first
   `round(x * cot_tokens)` CoT tokens + the format's close tokens (exactly what SSR's
   fork appends), decoded greedily. Each draft is compared with the run's final answer
   (both without leading whitespace tokens and EOS):

   * *common prefix*: leading tokens the draft and the final answer share (SSR's
     prefix verification would accept exactly these);
   * *predictable share*: the share of final-answer tokens that draft-backed suffix
     lookup proposes and greedy verification accepts. Simulation: walk the final
     answer; at each point an unbounded longest-match `SuffixProposer` over
     close tokens + draft proposes from the context close tokens + answer so far; the
     tokens it gets right count as predicted; the verifier then commits them plus one
     token of the model's own (not counted), and the walk goes on from there. A draft
     that rambles past the answer's length offers more to match, so the same measure
     is also taken with the draft cut to the final answer's length.

   Fork point 0.0 (no CoT at all) is the baseline the curve must rise from, and an
   *unrelated-answer control* (another item's reference answer used as the draft)
   shows how much the families' answer templates alone make predictable.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from selfspec_bench.degeneration import distinct_ngram_ratio
from selfspec_bench.degeneration import longest_periodic_span as periodic_span
from selfspec.engine.sampling import SamplingParams
from selfspec.thinking.policy import ThinkingLimits
from selfspec.spec.suffix import SuffixConfig, SuffixProposer
from selfspec_research.thinker.tasks import TaskItem, check_many, format_training_text
from selfspec_research.thinker.train import DataSpec

FORK_POINTS: tuple[float, ...] = (0.0, 0.10, 0.25, 0.50, 0.75, 0.90)
"""0.0 forks before any CoT token: the no-thinking baseline the other points must beat."""
HELDOUT_SEED = 1000
"""Held-out stream; training uses `selfspec_research.thinker.train.TRAIN_SEED` (0)."""

LOOP_MAX_PERIOD = 256
LOOP_MIN_REPEATS = 3
LOOP_MIN_SPAN = 64

ACCURACY_TARGET = 0.70
SELF_STOP_TARGET = 0.95
PREDICTABLE_AT_HALF_TARGET = 1 / 3

_UNCAPPED_SUFFIX = SuffixConfig(
    mode="longest_match", max_spec_tokens=1 << 16, spec_factor=float(1 << 16), spec_offset=float(1 << 16)
)


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


# --------------------------------------------------------------------------- measures


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def suffix_predicted_tokens(final: Sequence[int], draft: Sequence[int], anchor: Sequence[int]) -> int:
    """Final-answer tokens that suffix lookup over `anchor + draft` predicts (see module doc)."""
    proposer = SuffixProposer(_UNCAPPED_SUFFIX)
    proposer.add_source("draft", [*anchor, *draft])
    context = list(anchor)
    position = predicted = 0
    while position < len(final):
        proposal = proposer.propose(context, len(final) - position).tokens
        hits = common_prefix_len(proposal, final[position:])
        predicted += hits
        advance = min(hits + 1, len(final) - position)
        context.extend(final[position : position + advance])
        position += advance
    return predicted


def longest_periodic_span(ids: Sequence[int], max_period: int = LOOP_MAX_PERIOD) -> tuple[int, int]:
    """(period, span) in tokens of the longest block written >= 3 times back to back
    (`bench.degeneration.longest_periodic_span`, which the bench's loop flag shares)."""
    return periodic_span(ids, max_period, LOOP_MIN_REPEATS)


def has_loop(ids: Sequence[int]) -> bool:
    """A block repeated >= 3 times back to back over >= 64 tokens."""
    return longest_periodic_span(ids)[1] >= LOOP_MIN_SPAN


def strip_answer(ids: Sequence[int], tokenizer: Any, eos_ids: frozenset[int]) -> list[int]:
    """Answer tokens without leading whitespace-only tokens and trailing EOS."""
    out = list(ids)
    while out and out[-1] in eos_ids:
        out.pop()
    start = 0
    while start < len(out) and not tokenizer.decode([out[start]]).strip():
        start += 1
    return out[start:]


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
    from selfspec.thinking.format import split_reasoning

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
    outputs = llm.generate(prompts, params, limits=limits, thinking=True, progress=progress)
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
        "thinking_format": {"kind": fmt.kind, "start": fmt.start_marker, "end": fmt.end_marker, "close_ids": list(fmt.close_ids)},
        "seconds": {"natural_runs": round(generate_seconds, 2), "drafts": round(draft_seconds, 2)},
        "families": _family_summaries(records, references),
        "overall": _summary(records, [ref for refs in references.values() for ref in refs]),
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
            {"loop": float(has_loop(ids)), "distinct4": distinct_ngram_ratio(ids), "cot_tokens": len(tokenizer.encode(item.cot, add_special_tokens=False))}
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
    chosen = [
        run
        for family_runs in eligible.values()
        for run in family_runs[: config.convergence_items_per_family]
    ]
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
    outputs = llm.generate(contexts, params, thinking=False, progress=progress)
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


def template_control(tokenizer: Any, fmt: Any, items: Sequence[TaskItem]) -> dict[str, Any]:
    """How much of an answer a well-formed but *unrelated* draft predicts.

    Answers in these families are templated ("From X take Y to Z", TSV rows, code
    scaffolding), so suffix lookup gets part of any answer right from any answer of the
    same family. The control pairs each held-out item's reference answer with the next
    item's reference answer (same family, cyclically) as if it were the draft: the
    convergence curve means something only where it rises above this floor.
    """
    by_family: dict[str, list[list[int]]] = defaultdict(list)
    for item in items:
        by_family[item.family].append(list(tokenizer.encode(item.answer, add_special_tokens=False)))
    table: dict[str, Any] = {"families": {}}
    every: list[tuple[float, float]] = []
    for family, answers in by_family.items():
        shares = []
        for index, final in enumerate(answers):
            if len(answers) < 2 or not final:
                continue
            other = answers[(index + 1) % len(answers)]
            predicted = suffix_predicted_tokens(final, other, fmt.close_ids)
            shares.append((predicted / len(final), common_prefix_len(other, final) / len(final)))
        every += shares
        table["families"][family] = {
            "pairs": len(shares),
            "predictable_share": _mean([a for a, _ in shares]),
            "prefix_share": _mean([b for _, b in shares]),
        }
    table["overall"] = {
        "pairs": len(every),
        "predictable_share": _mean([a for a, _ in every]),
        "prefix_share": _mean([b for _, b in every]),
    }
    return table


# --------------------------------------------------------------------------- summaries


def _mean(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 4) if len(values) else None


def _summary(records: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Accuracy, self-stopping, loops and lengths of `records`, next to their references'."""
    n = len(records)
    return {
        "items": n,
        "accuracy": _mean([float(r["passed"]) for r in records]),
        "mean_score": _mean([r["score"] for r in records]),
        "self_stopped": _mean([float(r["self_stopped"]) for r in records]),
        "loops": sum(bool(r["loop"]) for r in records),
        "periodic_loops": sum(r["periodic_span"] >= LOOP_MIN_SPAN for r in records),
        "cap_hits": sum(not r["self_stopped"] for r in records),
        "mean_cot_tokens": _mean([r["cot_tokens"] for r in records]),
        "mean_answer_tokens": _mean([r["answer_tokens"] for r in records]),
        "distinct4": _mean([r["distinct4"] for r in records]),
        "reference_distinct4": _mean([r["distinct4"] for r in refs]),
        "reference_loops": int(sum(r["loop"] for r in refs)),
        "reference_mean_cot_tokens": _mean([r["cot_tokens"] for r in refs]),
    }


def _family_summaries(records: Sequence[Mapping[str, Any]], references: Mapping[str, list[dict[str, float]]]) -> dict[str, Any]:
    by_family: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_family[record["family"]].append(record)
    return {family: _summary(rows, references.get(family, [])) for family, rows in by_family.items()}


def convergence_table(rows: Sequence[Mapping[str, Any]], points: Sequence[float], cap: int | None = None) -> dict[str, Any]:
    """Per fork point, overall and per family: mean prefix / predictable shares and draft pass rate."""

    def aggregate(selected: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "drafts": len(selected),
            "common_prefix_tokens": _mean([r["common_prefix"] for r in selected]),
            "prefix_share": _mean([r["prefix_share"] for r in selected]),
            "predictable_share": _mean([r["predictable_share"] for r in selected]),
            "predictable_share_capped": _mean([r["predictable_share_capped"] for r in selected if "predictable_share_capped" in r]),
            "drafts_at_cap": sum(r["draft_tokens"] >= cap for r in selected) if cap else None,
            "draft_pass_rate": _mean([float(r["draft_passed"]) for r in selected]),
            "draft_tokens": _mean([r["draft_tokens"] for r in selected]),
        }

    families = sorted({r["family"] for r in rows})
    table: dict[str, Any] = {"points": list(points), "overall": {}, "families": {f: {} for f in families}}
    for point in points:
        key = f"{point:.2f}"
        at_point = [r for r in rows if r["point"] == point]
        table["overall"][key] = aggregate(at_point)
        for family in families:
            table["families"][family][key] = aggregate([r for r in at_point if r["family"] == family])
    table["items"] = len({r["uid"] for r in rows})
    return table


def check_targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's acceptance checks, computed from the results (never asserted by hand)."""
    families = results["families"]
    strong = [f for f, s in families.items() if (s["accuracy"] or 0) >= ACCURACY_TARGET]
    overall = results["overall"]
    table = results["convergence"]["overall"]
    shares = [table[key]["predictable_share"] for key in sorted(table) if table[key]["predictable_share"] is not None]
    half = table.get("0.50", {}).get("predictable_share")
    # The same curve with each draft cut to its final answer's length: early drafts that
    # ramble to the draft cap otherwise inflate the early points (lookup over a longer text).
    capped = [table[key].get("predictable_share_capped") for key in sorted(table)]
    capped = [c for c in capped if c is not None]
    half_capped = table.get("0.50", {}).get("predictable_share_capped")
    # The draft points only (10-90% of the CoT), without the prompt-only 0% reference.
    forked = [table[key]["predictable_share"] for key in sorted(table)
              if float(key) > 0 and table[key]["predictable_share"] is not None]
    return {
        "families_at_or_above_70pct": strong,
        "accuracy_ok": len(strong) >= 3,
        "self_stopped_ok": (overall["self_stopped"] or 0) >= SELF_STOP_TARGET,
        "no_loops": overall["loops"] == 0,
        "curve_rises": bool(shares) and all(b >= a for a, b in zip(shares, shares[1:])),
        "predictable_at_half": half,
        "predictable_at_half_ok": half is not None and half >= PREDICTABLE_AT_HALF_TARGET,
        "curve_rises_capped": bool(capped) and all(b >= a for a, b in zip(capped, capped[1:])),
        "curve_rises_after_forking": bool(forked) and all(b >= a for a, b in zip(forked, forked[1:])),
        "predictable_at_half_capped": half_capped,
    }


# --------------------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def render_markdown(results: dict[str, Any], training: Mapping[str, Any] | None = None, notes: str | None = None) -> str:
    """The eval report: training facts, accuracy table, convergence table, shortfalls,
    then `notes` (hand-written analysis kept in a file beside the results)."""
    cfg = results["config"]
    checks = results.get("checks") or check_targets(results)
    lines = [f"# Thinker eval: `{results['model']}`", ""]
    lines += [
        f"Held-out items: data `{cfg['data']['version']}`, seed {cfg['data']['seed']}, "
        f"{cfg['data']['items_per_family']} per family. Greedy; CoT cap {cfg['cot_cap']}, answer cap "
        f"{cfg['answer_cap']}; the model's end-of-thinking marker and EOS are honoured.",
        "",
    ]
    if training:
        lines += ["## Training", ""]
        for key, value in training.items():
            lines.append(f"- {key}: {value}")
        lines.append("")
    lines += [
        "## Natural runs",
        "",
        "| family | items | accuracy | mean score | self-stopped | loops (cap / periodic) | CoT tokens (ref) | answer tokens | distinct-4 (ref) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = list(results["families"].items()) + [("**all**", results["overall"])]
    for family, s in rows:
        lines.append(
            f"| {family} | {s['items']} | {_pct(s['accuracy'])} | {s['mean_score']:.3f} | {_pct(s['self_stopped'])} | "
            f"{s['loops']} ({s['cap_hits']} / {s['periodic_loops']}) | {s['mean_cot_tokens']:.0f} ({s['reference_mean_cot_tokens']:.0f}) | "
            f"{s['mean_answer_tokens']:.0f} | {s['distinct4']:.3f} ({s['reference_distinct4']:.3f}) |"
        )
    conv = results["convergence"]
    lines += [
        "",
        "Accuracy: the family's checker passes the whole answer (all-or-nothing; mean score is its partial credit). "
        "Self-stopped: thinking closed by the model's own marker and the answer ended at EOS. A loop is a run that hit "
        f"a cap, or whose tokens hold a block repeated ≥ {LOOP_MIN_REPEATS} times back to back over ≥ {LOOP_MIN_SPAN} tokens "
        f"(the same detector flags {results['overall']['reference_loops']} of the reference traces).",
        "",
        "## Convergence curve",
        "",
        f"Drafts forked from {conv['items']} self-stopped runs (up to {cfg['convergence_items_per_family']} per family) at "
        "each fraction of the CoT: prompt + CoT prefix + close tokens, greedy, at most "
        f"{cfg['draft_cap']} tokens. Common prefix: leading tokens shared with the final answer. Predictable: share of "
        "final-answer tokens that longest-match suffix lookup over the draft proposes and greedy verification accepts "
        "(each verification also commits one token of the model's own, not counted).",
        "",
        "| CoT seen | drafts (at the cap) | draft tokens | common prefix (tokens) | prefix share | predictable share | predictable, draft cut to the answer's length | drafts passing the checker |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, s in conv["overall"].items():
        if s["drafts"]:
            at_cap = s.get("drafts_at_cap")
            lines.append(
                f"| {float(key):.0%} | {s['drafts']} ({'–' if at_cap is None else at_cap}) | {s['draft_tokens']:.0f} | "
                f"{s['common_prefix_tokens']:.1f} | {_pct(s['prefix_share'])} | {_pct(s['predictable_share'])} | "
                f"{_pct(s.get('predictable_share_capped'))} | {_pct(s['draft_pass_rate'])} |"
            )
    control = results.get("template_control")
    if control:
        c = control["overall"]
        lines.append(
            f"| control: an unrelated answer of the same family as the draft | {c['pairs']} | – | – | {_pct(c['prefix_share'])} | "
            f"{_pct(c['predictable_share'])} | – | – |"
        )
    header = " | ".join(f"{float(k):.0%}" for k in conv["overall"])
    lines += ["", "Predictable share per family (last column: the unrelated-answer control):", "",
              f"| family | {header} | control |", "| --- " * (len(conv["overall"]) + 2) + "|"]
    for family, by_point in conv["families"].items():
        floor = control["families"].get(family, {}).get("predictable_share") if control else None
        lines.append(
            f"| {family} | " + " | ".join(_pct(by_point[k]["predictable_share"]) for k in conv["overall"]) + f" | {_pct(floor)} |"
        )
    lines += ["", "![convergence](convergence.png)", "", "## Acceptance checks (computed)", ""]
    lines += [
        f"- ≥ 70% accuracy in at least three families: {'yes' if checks['accuracy_ok'] else 'no'} "
        f"({', '.join(checks['families_at_or_above_70pct']) or 'none'})",
        f"- ends thinking by itself and stops at EOS in ≥ 95%: {'yes' if checks['self_stopped_ok'] else 'no'} "
        f"({_pct(results['overall']['self_stopped'])})",
        f"- no loops: {'yes' if checks['no_loops'] else 'no'} ({results['overall']['loops']})",
        f"- convergence curve rises with the draft point: {'yes' if checks['curve_rises'] else 'no'}; "
        f"with drafts cut to the answer's length: {'yes' if checks.get('curve_rises_capped') else 'no'}; "
        f"over the forks at 10-90% of the CoT only (without the prompt-only 0% point): "
        f"{'yes' if checks.get('curve_rises_after_forking') else 'no'}",
        f"- at 50% of the CoT ≥ 1/3 of the final answer predictable: {'yes' if checks['predictable_at_half_ok'] else 'no'} "
        f"({_pct(checks['predictable_at_half'])}; drafts cut to the answer's length: {_pct(checks.get('predictable_at_half_capped'))})",
        "",
        "## Where the thinker falls short (computed)",
        "",
    ]
    lines += shortfalls(results)
    seconds = results.get("seconds", {})
    lines += ["", f"Eval time: natural runs {seconds.get('natural_runs')} s, drafts {seconds.get('drafts')} s"
              + (f" on {results['device']}" if results.get("device") else "") + "."]
    if results.get("command"):
        lines += ["", "Command:", "", "```", results["command"], "```"]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def shortfalls(results: dict[str, Any]) -> list[str]:
    """Bullet points naming every target a family misses, with sample checker details."""
    out = []
    for family, s in results["families"].items():
        problems = []
        if (s["accuracy"] or 0) < ACCURACY_TARGET:
            problems.append(f"accuracy {_pct(s['accuracy'])} (partial credit {s['mean_score']:.2f})")
        if (s["self_stopped"] or 0) < SELF_STOP_TARGET:
            problems.append(f"self-stopped only {_pct(s['self_stopped'])}")
        if s["loops"]:
            problems.append(f"{s['loops']} loops")
        if problems:
            failures = [r["detail"] for r in results["records"] if r["family"] == family and not r["passed"]][:2]
            sample = "; ".join(f"`{d[:120]}`" for d in failures)
            out.append(f"- **{family}**: {', '.join(problems)}." + (f" Sample failures: {sample}" if sample else ""))
    conv = results["convergence"]
    for family, by_point in conv["families"].items():
        half = by_point.get("0.50", {}).get("predictable_share")
        if half is not None and half < PREDICTABLE_AT_HALF_TARGET:
            out.append(f"- **{family}**: only {_pct(half)} of the final answer predictable from a draft at 50% of the CoT.")
    return out or ["- No target missed in this run."]


def plot_convergence(results: dict[str, Any], path: str | Path) -> Path:
    """Two panels (predictable share, common-prefix share) against the fork point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conv = results["convergence"]
    keys = list(conv["overall"])
    xs = [100 * float(k) for k in keys]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, metric, title in (
        (axes[0], "predictable_share", "final-answer tokens predictable from the draft"),
        (axes[1], "prefix_share", "common prefix of draft and final answer"),
    ):
        for family, by_point in conv["families"].items():
            ys = [by_point[k][metric] for k in keys]
            axis.plot(xs, [100 * (y or 0) for y in ys], marker="o", linewidth=1.2, alpha=0.8, label=family)
        ys = [conv["overall"][k][metric] for k in keys]
        axis.plot(xs, [100 * (y or 0) for y in ys], marker="s", color="black", linewidth=2.4, label="all")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("draft forked at % of the CoT")
        axis.set_xticks(xs)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("% of final-answer tokens")
    axes[0].set_ylim(0, 100)
    axes[0].axhline(100 / 3, color="grey", linestyle=":", linewidth=1)
    control = (results.get("template_control") or {}).get("overall", {})
    for axis, metric in ((axes[0], "predictable_share"), (axes[1], "prefix_share")):
        if control.get(metric) is not None:
            axis.axhline(100 * control[metric], color="black", linestyle="--", linewidth=1, label="control: unrelated answer")
    axes[1].legend(fontsize=8, loc="lower right")
    from selfspec_bench.records import model_label  # a device run's /tmp/out/... path by its last component

    fig.suptitle(f"Convergence of drafts with the final answer: {model_label(results)}", fontsize=11)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def write_outputs(
    results: dict[str, Any], out_dir: str | Path, training: Mapping[str, Any] | None = None, notes: str | None = None
) -> list[Path]:
    """results.json, report.md and convergence.png under `out_dir`."""
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    results["checks"] = check_targets(results)
    paths = [target / "results.json", target / "report.md"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(render_markdown(results, training, notes))
    if results["convergence"]["items"]:
        paths.append(plot_convergence(results, target / "convergence.png"))
    return paths


__all__ = [
    "EvalConfig",
    "FORK_POINTS",
    "HELDOUT_SEED",
    "check_targets",
    "common_prefix_len",
    "convergence_table",
    "distinct_ngram_ratio",
    "has_loop",
    "longest_periodic_span",
    "plot_convergence",
    "render_markdown",
    "run_eval",
    "strip_answer",
    "suffix_predicted_tokens",
    "template_control",
    "write_outputs",
]
