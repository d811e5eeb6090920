"""Scoring thinker-task answers with the generators' own checkers."""

from __future__ import annotations

from ..datasets.sample import BenchSample
from .result import ScoreResult


def score_thinker(sample: BenchSample, completion: str, *, timeout_s: float = 10.0) -> ScoreResult:
    """`passed` = the checker's all-or-nothing verdict; `score` = its partial credit."""
    from selfspec.thinker.tasks import TaskItem, check

    result = check(TaskItem.from_dict(sample.reference["item"]), completion)
    return ScoreResult(passed=bool(result.passed), score=float(result.score), detail=result.detail[:200])
