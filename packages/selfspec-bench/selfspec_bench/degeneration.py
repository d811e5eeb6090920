"""Is a benchmark answer degenerate text that any draft would "match"?

Why this exists: at the paper-row fixed lengths small models are forced to write thousands of
answer tokens, and they fill them with repetition. A draft that falls into the same repetition is
accepted for free, so such samples flatter every speculative mode and must be set apart. The
first measure (distinct-4-gram ratio of the answer tokens below 0.5) catches answers that are
loops from start to end. Two more kinds get past it; both are caught here from the answer
*text*, so that committed records are re-judged without re-running them:

- **repeated block**: one block written three or more times back to back over >= 512
  characters, a loop that starts partway through an otherwise varied answer (`... S-shaped
  S-shaped S-shaped ...`, a paragraph written four times over). Reference answers of HumanEval,
  ClassEval (solutions and tests) and the five LongProc tasks repeat at most 173 characters so.
- **counting run**: >= 64 integers in arithmetic progression, each separated from the last by at
  most four characters (`301, 302, 303, ...` or `301.\n302.\n...`): the model counts instead of
  answering, and the draft counts the same way. References hold at most 16 such terms.

Not caught, on purpose: numbered lists whose items alternate (`122. Brand building\n123. Paid
advertising\n...`). Their text differs from a legitimately templated answer (LongProc's ToM
tracking solutions repeat a step template with only the step number changing) only in meaning,
which no content-free rule can see.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

DISTINCT4_LOOP_THRESHOLD = 0.5  # below this distinct-4-gram ratio of its tokens an answer is a loop
BLOCK_MIN_REPEATS = 3
BLOCK_MIN_CHARS = 512
BLOCK_MAX_PERIOD = 512  # characters; longer blocks repeated 3 times need > 1,500 characters of loop
COUNTING_MIN_TERMS = 64
COUNTING_MAX_GAP = 4  # characters between two numbers of one run

_INTEGER = re.compile(r"\d+")


def distinct_ngram_ratio(tokens: Sequence[int], n: int = 4) -> float:
    """Distinct n-grams / all n-grams of a token sequence: ~1 for prose or code, low for output
    stuck in a loop (1.0 when there is no n-gram at all). The bench's records and the thinker's
    evaluator both measure with this one function, so their loop figures mean the same thing."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def longest_periodic_span(
    seq: Sequence[int] | np.ndarray, max_period: int, min_repeats: int = BLOCK_MIN_REPEATS
) -> tuple[int, int]:
    """(period, span) of the longest stretch where `seq[t] == seq[t + period]` throughout, over
    token ids or character codes alike (the thinker's evaluator judges its loops on tokens).

    The span counts the items the stretch covers (the run of equalities plus one period), so a
    block of p items written r times in a row has span r * p; only stretches of at least
    `min_repeats` repeats count.
    """
    items = np.asarray(seq, dtype=np.int64)
    best_period, best_span = 0, 0
    for period in range(1, min(max_period, len(items) // 2) + 1):
        equal = items[:-period] == items[period:]
        if not equal.any():
            continue
        edges = np.flatnonzero(np.diff(np.concatenate(([0], equal.astype(np.int8), [0]))))
        span = int((edges[1::2] - edges[::2]).max()) + period
        if span >= min_repeats * period and span > best_span:
            best_period, best_span = period, span
    return best_period, best_span


def repeated_block_span(text: str, max_period: int = BLOCK_MAX_PERIOD) -> tuple[int, int]:
    """(period, span) in characters of the longest block of `text` repeated back to back."""
    return longest_periodic_span(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32), max_period)


def longest_counting_run(text: str, max_gap: int = COUNTING_MAX_GAP) -> int:
    """Most integers in a row that step by the same non-zero amount with <= `max_gap` characters
    between neighbours (equal integers are a repeated block's business, not counting)."""
    best = run = 0
    prev_value: int | None = None
    prev_end = -max_gap - 1
    step: int | None = None
    for match in _INTEGER.finditer(text):
        value = int(match.group())
        diff = None if prev_value is None else value - prev_value
        adjacent = match.start() - prev_end <= max_gap and diff not in (None, 0)
        if adjacent and (step is None or diff == step):
            step, run = diff, run + 1
        elif adjacent:
            step, run = diff, 2  # the previous number starts a run with another step
        else:
            step, run = None, 1
        best = max(best, run)
        prev_value, prev_end = value, match.end()
    return best


@lru_cache(maxsize=64)
def text_degeneration(text: str) -> str | None:
    """ "repeated block", "counting run" or None for an answer's text (cached: the modes of one
    sample share their text whenever they are exact, and their records sit together; a small
    cache, since answers run to 20,000 characters and a bench process lives for hours)."""
    if repeated_block_span(text)[1] >= BLOCK_MIN_CHARS:
        return "repeated block"
    if longest_counting_run(text) >= COUNTING_MIN_TERMS:
        return "counting run"
    return None


def loop_kind(record: dict[str, Any]) -> str | None:
    """Why a bench record's answer counts as a loop, or None: "distinct-4" (the token measure
    recorded at run time), "repeated block" or "counting run" (from the answer text)."""
    distinct4 = record.get("answer_distinct4")
    if distinct4 is not None and distinct4 < DISTINCT4_LOOP_THRESHOLD:
        return "distinct-4"
    text = record.get("answer_text")
    kind = text_degeneration(text) if isinstance(text, str) and text else None
    if kind is None and record.get("loop") is True:  # flagged at run time by a measure not recomputable here
        return record.get("loop_kind") or "distinct-4"
    return kind
