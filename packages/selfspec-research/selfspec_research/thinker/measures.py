"""What the thinker eval measures in a run, a draft or a reference answer.

* **Common prefix**: leading tokens a draft and the final answer share (SSR's prefix
  verification would accept exactly these).
* **Predictable tokens**: final-answer tokens that draft-backed suffix lookup proposes and
  greedy verification accepts. Simulation: walk the final answer; at each point an
  unbounded longest-match `SuffixProposer` over close tokens + draft proposes from the
  context close tokens + answer so far; the tokens it gets right count as predicted; the
  verifier then commits them plus one token of the model's own (not counted), and the
  walk goes on from there.
* **Loops**: a block of at most 256 tokens written at least 3 times back to back, over at
  least 64 tokens: a greedy small model stuck in a cycle.
* **The unrelated-answer control** (`template_control`): the same lookup with another
  item's reference answer as the draft, the floor the convergence curve must rise above.

The aggregations (per family, per fork point) are here too, so results written by an
earlier run can be re-summarised from their records alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from selfspec.spec.suffix import SuffixConfig, SuffixProposer
from selfspec_bench.degeneration import longest_periodic_span as periodic_span
from selfspec_research.thinker.tasks import TaskItem

LOOP_MAX_PERIOD = 256
LOOP_MIN_REPEATS = 3
LOOP_MIN_SPAN = 64

_UNCAPPED_SUFFIX = SuffixConfig(
    mode="longest_match", max_spec_tokens=1 << 16, spec_factor=float(1 << 16), spec_offset=float(1 << 16)
)


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
            "predictable_share": mean_or_none([a for a, _ in shares]),
            "prefix_share": mean_or_none([b for _, b in shares]),
        }
    table["overall"] = {
        "pairs": len(every),
        "predictable_share": mean_or_none([a for a, _ in every]),
        "prefix_share": mean_or_none([b for _, b in every]),
    }
    return table


# --------------------------------------------------------------------------- summaries


def mean_or_none(values: Sequence[float]) -> float | None:
    return round(float(np.mean(values)), 4) if len(values) else None


def summarize_records(records: Sequence[Mapping[str, Any]], refs: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Accuracy, self-stopping, loops and lengths of `records`, next to their references'."""
    n = len(records)
    return {
        "items": n,
        "accuracy": mean_or_none([float(r["passed"]) for r in records]),
        "mean_score": mean_or_none([r["score"] for r in records]),
        "self_stopped": mean_or_none([float(r["self_stopped"]) for r in records]),
        "loops": sum(bool(r["loop"]) for r in records),
        "periodic_loops": sum(r["periodic_span"] >= LOOP_MIN_SPAN for r in records),
        "cap_hits": sum(not r["self_stopped"] for r in records),
        "mean_cot_tokens": mean_or_none([r["cot_tokens"] for r in records]),
        "mean_answer_tokens": mean_or_none([r["answer_tokens"] for r in records]),
        "distinct4": mean_or_none([r["distinct4"] for r in records]),
        "reference_distinct4": mean_or_none([r["distinct4"] for r in refs]),
        "reference_loops": int(sum(r["loop"] for r in refs)),
        "reference_mean_cot_tokens": mean_or_none([r["cot_tokens"] for r in refs]),
    }


def family_summaries(
    records: Sequence[Mapping[str, Any]], references: Mapping[str, list[dict[str, float]]]
) -> dict[str, Any]:
    by_family: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_family[record["family"]].append(record)
    return {family: summarize_records(rows, references.get(family, [])) for family, rows in by_family.items()}


def convergence_table(
    rows: Sequence[Mapping[str, Any]], points: Sequence[float], cap: int | None = None
) -> dict[str, Any]:
    """Per fork point, overall and per family: mean prefix / predictable shares and draft pass rate."""

    def aggregate(selected: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "drafts": len(selected),
            "common_prefix_tokens": mean_or_none([r["common_prefix"] for r in selected]),
            "prefix_share": mean_or_none([r["prefix_share"] for r in selected]),
            "predictable_share": mean_or_none([r["predictable_share"] for r in selected]),
            "predictable_share_capped": mean_or_none(
                [r["predictable_share_capped"] for r in selected if "predictable_share_capped" in r]
            ),
            "drafts_at_cap": sum(r["draft_tokens"] >= cap for r in selected) if cap else None,
            "draft_pass_rate": mean_or_none([float(r["draft_passed"]) for r in selected]),
            "draft_tokens": mean_or_none([r["draft_tokens"] for r in selected]),
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


__all__ = [
    "LOOP_MAX_PERIOD",
    "LOOP_MIN_REPEATS",
    "LOOP_MIN_SPAN",
    "common_prefix_len",
    "convergence_table",
    "family_summaries",
    "has_loop",
    "longest_periodic_span",
    "mean_or_none",
    "strip_answer",
    "suffix_predicted_tokens",
    "summarize_records",
    "template_control",
]
