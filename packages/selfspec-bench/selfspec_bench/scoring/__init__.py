"""Quality scoring for bench completions: ``score(sample, completion_text)``.

Dispatches on ``sample.benchmark``. Code benchmarks execute the generated code in a
subprocess (temp dir, timeout, process-group kill; see :mod:`.sandbox`), never in
this process. Every scorer returns a :class:`ScoreResult`.
"""

from __future__ import annotations

from typing import Callable

from ..datasets.sample import BenchSample
from ..plugins import PLUGIN_SCORERS, load_plugins
from .classeval import score_classeval
from .gsm8k import score_gsm8k
from .humaneval import score_humaneval
from .longproc import LONGPROC_SCORERS
from .math500 import score_math500
from .mbpp import score_mbpp
from .result import ScoreResult

Scorer = Callable[..., ScoreResult]

SCORERS: dict[str, Scorer] = {
    "humaneval": score_humaneval,
    "classeval": score_classeval,
    "mbpp": score_mbpp,
    "gsm8k": score_gsm8k,
    "math500": score_math500,
    **{f"longproc/{task}": scorer for task, scorer in LONGPROC_SCORERS.items()},
}


def scorer_for(benchmark: str) -> Scorer:
    load_plugins()
    scorer = SCORERS.get(benchmark) or PLUGIN_SCORERS.get(benchmark)
    if scorer is None:
        known = list(SCORERS) + list(PLUGIN_SCORERS)
        raise ValueError(f"no scorer for benchmark {benchmark!r}; known: {', '.join(known)}")
    return scorer


def score(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    """Score one completion (the model's answer text; a leading CoT up to ``</think>`` is ignored)."""
    return scorer_for(sample.benchmark)(sample, completion_text, timeout_s=timeout_s)


__all__ = ["SCORERS", "ScoreResult", "score", "scorer_for"]
