"""Which benchmark samples fit the model's context at the run's token budgets, and how long
the engine's context must be.

Why: LongProc prompts run to 6,800 tokens (countdown) and beyond (html_to_tsv pages: median
13,000 tokens with SmolLM2's tokenizer, up to 83,000), and the paper row adds a 2,000-token
CoT and a 2,000-token answer. SmolLM2's context is 8,192: none of countdown's samples fits,
8 of html_to_tsv's 100 do. So the engine gets exactly the room the longest runnable sample
needs (within the model's context; a fixed margin over CoT + answer would abort the whole run
at the first prompt longer than it), and a sample that cannot fit is skipped with a recorded
reason instead of being run truncated — at fixed lengths a shorter CoT or answer would be
another experiment, not the paper row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from selfspec.thinking.format import ThinkingFormat, build_prompt_ids
from selfspec_bench.datasets.sample import BenchSample

CLOSE_MARGIN = 16
"""Tokens kept beyond prompt + CoT cap + answer cap: the end-of-thinking marker and slack."""


@dataclass(frozen=True)
class ContextFit:
    """The samples to run, the ones skipped (one reason each) and the engine's max_len."""

    runnable: list[BenchSample]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    max_len: int = 0
    context: int = 0


def fit_to_context(
    samples: Sequence[BenchSample],
    tokenizer: Any,
    fmt: ThinkingFormat,
    context: int,
    cot_cap: int,
    answer_cap: int,
    *,
    thinking: bool = True,
) -> ContextFit:
    """Split `samples` by whether prompt + `cot_cap` + `answer_cap` (+ a margin) fits `context`.

    `max_len` is the largest need among the runnable samples (at least CoT + answer + margin
    + 1, so short-prompt runs keep the room they always had); skipped entries carry the
    sample id, its prompt length, what it needs and the context.
    """
    runnable: list[BenchSample] = []
    skipped: list[dict[str, Any]] = []
    floor = cot_cap + answer_cap + CLOSE_MARGIN + 1
    longest = 0
    for sample in samples:
        prompt_tokens = len(build_prompt_ids(tokenizer, sample.messages, fmt, enable_thinking=thinking))
        needed = prompt_tokens + cot_cap + answer_cap + CLOSE_MARGIN
        if needed > context:
            skipped.append(
                {
                    "sample_id": sample.id,
                    "benchmark": sample.benchmark,
                    "prompt_tokens": prompt_tokens,
                    "needed_tokens": needed,
                    "context": context,
                    "reason": f"prompt ({prompt_tokens}) + CoT cap ({cot_cap}) + answer cap ({answer_cap}) "
                    f"exceed the model's context ({context})",
                }
            )
            continue
        runnable.append(sample)
        longest = max(longest, needed)
    return ContextFit(runnable, skipped, min(context, max(longest, floor)), context)


__all__ = ["CLOSE_MARGIN", "ContextFit", "fit_to_context"]
