"""MATH-500: normalized LaTeX match of the final boxed answer (see math_normalize for limits)."""

from __future__ import annotations

from ..datasets.sample import BenchSample
from .final_answer import final_answer
from .math_normalize import latex_equivalent
from .result import ScoreResult, binary


def score_math500(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    gold = str(sample.reference["answer"])
    answer, source = final_answer(completion_text, prefer_boxed=True)
    if answer is None:
        return binary(False, "no final answer found")
    correct = latex_equivalent(answer, gold)
    return binary(correct, f"answer {answer!r} (from {source}) vs gold {gold!r}")
