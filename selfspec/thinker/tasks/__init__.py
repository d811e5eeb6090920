"""The thinker task families and their registry.

Four families of synthetic think→answer traces whose answers take shape while the
model thinks (see `base` for the contract every family follows):

* ``class_synthesis`` — a Python class from a spec; checked by unit tests in a subprocess.
* ``record_extraction`` — records from messy HTML/text into TSV; exact rows + row F1.
* ``route_finding`` — the fewest-hop route through a transit network; hop validity + length.
* ``arithmetic_search`` — countdown puzzles; every equation replayed.

Splits are named by seed: ``generate_split(families(), seed=0, n=1000)`` for training and
another seed for held-out items; an item is a pure function of (family, version, seed,
index, knobs), so any process regenerates the same split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .arithmetic_search import ArithmeticSearch
from .base import (
    CheckResult,
    TaskFamily,
    TaskItem,
    estimate_tokens,
    final_answer_text,
    format_training_text,
    ordered_line_coverage,
    stable_rng,
)
from .class_synthesis import ClassSynthesis
from .record_extraction import RecordExtraction
from .route_finding import RouteFinding

_FAMILY_TYPES: dict[str, type[TaskFamily]] = {
    family.name: family for family in (ClassSynthesis, RecordExtraction, RouteFinding, ArithmeticSearch)
}


def families() -> list[str]:
    """The registered family names, in a fixed order."""
    return list(_FAMILY_TYPES)


def get_family(name: str, **knobs: Any) -> TaskFamily:
    """An instance of family `name` with the given difficulty knobs (defaults otherwise)."""
    try:
        family_type = _FAMILY_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown task family {name!r}; known: {', '.join(_FAMILY_TYPES)}") from None
    return family_type(**knobs)


def generate(family: str, seed: int, index: int, **knobs: Any) -> TaskItem:
    """Item `index` of family `family` in the stream `seed`."""
    return get_family(family, **knobs).generate(seed, index)


def generate_split(
    families: str | Sequence[str],
    seed: int,
    n: int,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    start: int = 0,
) -> list[TaskItem]:
    """`n` items *per family* from stream `seed` (indices `start` .. `start + n - 1`),
    interleaved family by family so any prefix of the list stays balanced.

    Use different seeds for training and held-out splits. `knobs` maps a family name to
    the knobs its generator gets.
    """
    names = [families] if isinstance(families, str) else list(families)
    instances = [get_family(name, **dict((knobs or {}).get(name, {}))) for name in names]
    return [family.generate(seed, index) for index in range(start, start + n) for family in instances]


def check(item: TaskItem, answer_text: str) -> CheckResult:
    """Judge one answer (a bare answer or a full output with its thinking) for `item`."""
    return get_family(item.family).check(item, answer_text)


def check_many(items: Sequence[TaskItem], answers: Sequence[str]) -> list[CheckResult]:
    """Judge many answers, batched per family (one subprocess for all class answers)."""
    if len(items) != len(answers):
        raise ValueError(f"{len(items)} items but {len(answers)} answers")
    positions: dict[str, list[int]] = defaultdict(list)
    for position, item in enumerate(items):
        positions[item.family].append(position)
    results: list[CheckResult | None] = [None] * len(items)
    for name, indices in positions.items():
        verdicts = get_family(name).check_many([items[i] for i in indices], [answers[i] for i in indices])
        for i, verdict in zip(indices, verdicts):
            results[i] = verdict
    return [result for result in results if result is not None]


def iter_items(family: str, seed: int, indices: Iterable[int], **knobs: Any) -> Iterable[TaskItem]:
    """Lazily generate items (for writing large splits without holding them all)."""
    instance = get_family(family, **knobs)
    for index in indices:
        yield instance.generate(seed, index)


__all__ = [
    "ArithmeticSearch",
    "CheckResult",
    "ClassSynthesis",
    "RecordExtraction",
    "RouteFinding",
    "TaskFamily",
    "TaskItem",
    "check",
    "check_many",
    "estimate_tokens",
    "families",
    "final_answer_text",
    "format_training_text",
    "generate",
    "generate_split",
    "get_family",
    "iter_items",
    "ordered_line_coverage",
    "stable_rng",
]
