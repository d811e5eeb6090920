"""GSM8K: exact numeric match of the final answer."""

from __future__ import annotations

from ..datasets.sample import BenchSample
from .final_answer import final_answer, last_number
from .math_normalize import as_number, latex_equivalent, numbers_equal
from .result import ScoreResult, binary


def score_gsm8k(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    gold = str(sample.reference["answer"])
    answer, source = final_answer(completion_text)
    if answer is None:
        return binary(False, "no final answer found")
    # An answer that does not start with a number ("a total of 18") gives its last number.
    number = answer if as_number(answer) is not None else (last_number(answer) or answer)
    correct = numbers_equal(number, gold) or latex_equivalent(answer, gold)
    return binary(correct, f"answer {answer!r} (from {source}) vs gold {gold!r}")
