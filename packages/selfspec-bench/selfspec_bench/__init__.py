"""``selfspec bench``: benchmark datasets and quality scoring.

``load_benchmark(name)`` gives chat-formatted :class:`BenchSample` items for
HumanEval, ClassEval, LongProc (five tasks), GSM8K, MBPP and MATH-500;
``score(sample, completion_text)`` grades a model's answer to one of them.

The harness is a part of its own (``packages/selfspec-bench``, its own pyproject): it
depends on the inference package, never the other way round, so ``selfspec`` installs
without matplotlib, scipy or the benchmark data, and the ``bench`` command appears once
this part is installed (the ``selfspec.commands`` entry point).
"""

from __future__ import annotations

from .datasets import BenchSample, available_benchmarks, load_benchmark
from .scoring import ScoreResult, score

__all__ = ["BenchSample", "ScoreResult", "available_benchmarks", "load_benchmark", "score"]
