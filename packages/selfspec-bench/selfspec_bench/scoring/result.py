"""What every scorer returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreResult:
    """Outcome of scoring one completion.

    Attributes:
        passed: the strict verdict (all tests pass / exact answer / F1 == 1).
        score: in [0, 1]; partial credit where the benchmark defines one (fraction of
            unit tests, row F1, fraction of steps), else 1.0 or 0.0.
        detail: short human-readable reason, for reports and debugging.
        skipped: the scorer could not run here (e.g. no C++ compiler); ``passed`` is
            False and the item should be left out of aggregates rather than counted wrong.
    """

    passed: bool
    score: float
    detail: str
    skipped: bool = False


def binary(passed: bool, detail: str) -> ScoreResult:
    return ScoreResult(passed=passed, score=1.0 if passed else 0.0, detail=detail)


def skipped(detail: str) -> ScoreResult:
    return ScoreResult(passed=False, score=0.0, detail=f"skipped: {detail}", skipped=True)
