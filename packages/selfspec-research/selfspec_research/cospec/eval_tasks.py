"""The items `selfspec cospec eval` runs: thinker task families, GSM8K and HumanEval, on held-out seeds.

CoSpec is lossy, so its eval must score answers, not compare tokens; the scorers are the
ones the rest of the project already trusts (the thinker families' checkers, GSM8K's exact
numeric answer). Items come from streams the target (and an arbitrator trained on thinker
traces) never saw:

* thinker families: generator stream `seed` (default `HELDOUT_SEED`, 1000, as the thinker
  eval); the training stream `TRAIN_SEED` (0) is refused, and so is any seed an arbitrator
  checkpoint lists under `training.data_seeds`.
* GSM8K: the test split only (the train split is not shipped); `seed` picks which `n`
  problems, through the same SHA-256-seeded RNG the task generators use. Because the
  arbitrator trainer (`cospec.train_arbitrator`) has to take its GSM8K items from the same
  split, a checkpoint lists them under `training.gsm8k_ids`, and the eval draws from the
  remaining problems only (`exclude_ids`; with none excluded the pick is unchanged).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from selfspec.thinking.format import split_reasoning
from selfspec_bench.datasets.gsm8k import load_gsm8k
from selfspec_bench.datasets.humaneval import load_humaneval
from selfspec_bench.scoring import score as score_sample
from selfspec_research.thinker.data_versions import DEFAULT_TASK_KNOBS, TRAIN_SEED, data_version_knobs
from selfspec_research.thinker.tasks import check_many, format_training_text, generate_split, stable_rng
from selfspec_research.thinker.tasks import families as thinker_families

GSM8K = "gsm8k"
HUMANEVAL = "humaneval"

Scorer = Callable[[Sequence[Any], Sequence[str]], list[tuple[bool, float]]]


@dataclass(frozen=True)
class EvalItem:
    """One prompt and what its scorer needs."""

    uid: str
    messages: list[dict[str, str]]
    reference: Any  # a thinker `TaskItem` or a bench `BenchSample`


@dataclass
class EvalTask:
    """A task's items, whether the model should think, and how an answer text is scored.

    `score(references, answer_texts)` returns (passed, score in [0, 1]) per answer.
    """

    name: str
    items: list[EvalItem]
    thinking: bool | None
    score: Scorer


def known_tasks() -> list[str]:
    """Every task name the eval and the arbitrator trainer accept."""
    return [*thinker_families(), GSM8K, HUMANEVAL]


def parse_tasks(value: str) -> tuple[str, ...]:
    """A comma list of task names, validated (ValueError names the unknown ones)."""
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in known_tasks()]
    if not names or unknown:
        raise ValueError(f"unknown tasks {unknown or value!r}; known: {', '.join(known_tasks())}")
    return names


def check_heldout_seed(seed: int, tasks: Sequence[str], forbidden: Sequence[int] = ()) -> None:
    """Refuse a seed the target or the arbitrator was trained on (thinker families only)."""
    if not any(task not in (GSM8K, HUMANEVAL) for task in tasks):
        return
    if seed == TRAIN_SEED:
        raise ValueError(f"seed {seed} is the thinker's training stream; use a held-out seed (default 1000)")
    if seed in set(forbidden):
        raise ValueError(f"seed {seed} is listed in the arbitrator checkpoint's training.data_seeds; use another")


def thinker_scorer(references: Sequence[Any], answers: Sequence[str]) -> list[tuple[bool, float]]:
    """The thinker families' checkers (partial credit) as an `EvalTask.score`."""
    return [(v.passed, float(v.score)) for v in check_many(list(references), list(answers))]


def thinker_task(name: str, n: int, seed: int, start: int = 0, data_version: str | None = None) -> EvalTask:
    """`n` items of thinker family `name` from stream `seed` (indices from `start`), with
    the knobs of `data_version` (None: thinker-data-v1's), run with thinking on (they are
    think→answer traces). Harder versions are where a target fails items a draft may solve."""
    family_knobs = data_version_knobs(data_version) if data_version is not None else DEFAULT_TASK_KNOBS
    knobs = {name: dict(family_knobs.get(name, {}))}
    items = generate_split([name], seed, n, knobs=knobs, start=start)
    return EvalTask(
        name=name,
        items=[EvalItem(item.uid, format_training_text(item)[0], item) for item in items],
        thinking=True,
        score=thinker_scorer,
    )


def bench_scorer() -> Scorer:
    """The benchmark's own checker (`selfspec_bench.scoring.score`, dispatched by each
    sample's benchmark: GSM8K's exact answer, HumanEval's tests in a subprocess) as an
    `EvalTask.score`."""

    def score(references: Sequence[Any], answers: Sequence[str]) -> list[tuple[bool, float]]:
        results = [score_sample(sample, answer) for sample, answer in zip(references, answers)]
        return [(r.passed, float(r.score)) for r in results]

    return score


def answer_text(llm: Any, output_ids: Sequence[int], thinking: bool) -> str:
    """The answer part of an output (after the end-of-thinking marker), decoded.

    One function for every eval run, training rollout and counterfactual branch, so all
    are scored alike.
    """
    fmt = llm.thinking_format
    ids = list(output_ids)
    if fmt is not None:
        _, ids = split_reasoning(ids, fmt, starts_in_thinking=thinking)
    return llm.tokenizer.decode(ids, skip_special_tokens=True)


def _dataset_task(name: str, samples: Sequence[Any], n: int, seed: int, exclude_ids: Sequence[str] = ()) -> EvalTask:
    """`n` of a benchmark's samples picked by `seed`, none of `exclude_ids`."""
    excluded = set(exclude_ids)
    # The pool is a list of indices (the same pick as over range() when nothing is excluded).
    pool = [i for i, sample in enumerate(samples) if sample.id not in excluded]
    if n > len(pool):
        raise ValueError(
            f"--n {n} exceeds the {len(pool)} {name} problems left"
            + (f" after the {len(samples) - len(pool)} an arbitrator trained on" if excluded else "")
        )
    picked = sorted(stable_rng("cospec-eval", name, seed).sample(pool, n))
    return EvalTask(
        name=name,
        items=[EvalItem(samples[i].id, samples[i].messages, samples[i]) for i in picked],
        thinking=None,  # the model's own default (smollm2-thinker thinks)
        score=bench_scorer(),
    )


def build_task(
    name: str,
    n: int,
    seed: int,
    *,
    gsm8k_path: str | None = None,
    exclude_gsm8k_ids: Sequence[str] = (),
    humaneval_path: str | None = None,
    data_version: str | None = None,
) -> EvalTask:
    """`n` held-out items of task `name` (GSM8K: none of `exclude_gsm8k_ids`; thinker
    families: with `data_version`'s knobs, None: thinker-data-v1's)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if name == GSM8K:
        return _dataset_task(GSM8K, load_gsm8k(path=gsm8k_path), n, seed, exclude_gsm8k_ids)
    if name == HUMANEVAL:
        return _dataset_task(HUMANEVAL, load_humaneval(path=humaneval_path), n, seed)  # nothing trains on HumanEval
    if name not in thinker_families():
        raise ValueError(f"unknown task {name!r}; known: {', '.join(known_tasks())}")
    return thinker_task(name, n, seed, data_version=data_version)


__all__ = [
    "GSM8K",
    "HUMANEVAL",
    "EvalItem",
    "EvalTask",
    "answer_text",
    "bench_scorer",
    "build_task",
    "check_heldout_seed",
    "known_tasks",
    "parse_tasks",
    "thinker_scorer",
    "thinker_task",
]
