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

A family can have several versions (``versions(name)``); version 1 is the default. A
version is picked like a knob: ``get_family("route_finding", version=2)``, or a
``"version"`` entry in the knobs a split gets (that is how a data version such as
``thinker-data-v2`` in `selfspec_research.thinker.data_versions` selects them). Checking dispatches on the
item's own version, so stored items of any version check alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from .arithmetic_search import ArithmeticSearch, ArithmeticSearchV2
from .arithmetic_search_v3 import ArithmeticSearchV3
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
from .class_synthesis import ClassSynthesis, ClassSynthesisV2
from .class_synthesis_plan import ClassSynthesisV3
from .record_extraction import RecordExtraction, RecordExtractionV2
from .record_extraction_v3 import RecordExtractionV3
from .route_finding import RouteFinding, RouteFindingV2, RouteFindingV3
from .route_finding_v4 import RouteFindingV4

DEFAULT_VERSION = 1
"""The family version `get_family` builds when none is named (the data of thinker-data-v1)."""

_FAMILY_TYPES: dict[str, dict[int, type[TaskFamily]]] = {}
for _family in (
    ClassSynthesis,
    RecordExtraction,
    RouteFinding,
    ArithmeticSearch,
    RecordExtractionV2,
    RouteFindingV2,
    ArithmeticSearchV2,
    RouteFindingV3,
    ClassSynthesisV2,
    RecordExtractionV3,
    RouteFindingV4,
    ArithmeticSearchV3,
    ClassSynthesisV3,
):
    _FAMILY_TYPES.setdefault(_family.name, {})[_family.version] = _family


def families() -> list[str]:
    """The registered family names, in a fixed order."""
    return list(_FAMILY_TYPES)


def versions(name: str) -> list[int]:
    """The versions of family `name`, oldest first."""
    return sorted(_family_versions(name))


def _family_versions(name: str) -> dict[int, type[TaskFamily]]:
    try:
        return _FAMILY_TYPES[name]
    except KeyError:
        raise KeyError(f"unknown task family {name!r}; known: {', '.join(_FAMILY_TYPES)}") from None


def get_family(name: str, version: int | None = None, **knobs: Any) -> TaskFamily:
    """An instance of version `version` (default `DEFAULT_VERSION`) of family `name` with
    the given difficulty knobs (the version's defaults otherwise)."""
    by_version = _family_versions(name)
    wanted = DEFAULT_VERSION if version is None else int(version)
    if wanted not in by_version:
        raise KeyError(f"family {name!r} has no version {version!r}; known: {sorted(by_version)}")
    return by_version[wanted](**knobs)


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
    return get_family(item.family, version=item.version).check(item, answer_text)


def check_many(items: Sequence[TaskItem], answers: Sequence[str]) -> list[CheckResult]:
    """Judge many answers, batched per family (one subprocess for all class answers)."""
    if len(items) != len(answers):
        raise ValueError(f"{len(items)} items but {len(answers)} answers")
    positions: dict[tuple[str, int], list[int]] = defaultdict(list)
    for position, item in enumerate(items):
        positions[(item.family, item.version)].append(position)
    results: list[CheckResult | None] = [None] * len(items)
    for (name, version), indices in positions.items():
        family = get_family(name, version=version)
        verdicts = family.check_many([items[i] for i in indices], [answers[i] for i in indices])
        for i, verdict in zip(indices, verdicts):
            results[i] = verdict
    return [result for result in results if result is not None]


__all__ = [
    "ArithmeticSearch",
    "ArithmeticSearchV2",
    "ArithmeticSearchV3",
    "CheckResult",
    "ClassSynthesis",
    "ClassSynthesisV2",
    "ClassSynthesisV3",
    "DEFAULT_VERSION",
    "RecordExtraction",
    "RecordExtractionV2",
    "RecordExtractionV3",
    "RouteFinding",
    "RouteFindingV2",
    "RouteFindingV3",
    "RouteFindingV4",
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
    "ordered_line_coverage",
    "stable_rng",
    "versions",
]
