"""What the thinker tests share: the tiny tokenizer and toy task data (tiny knobs, so a
CPU trains and evaluates on them in seconds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from selfspec.testing.tiny import tiny_tokenizer
from selfspec_research.thinker.examples import DataSpec

TOY_KNOBS = {
    "class_synthesis": {"min_methods": 1, "max_methods": 1, "min_answer_tokens": 1},
    "record_extraction": {
        "min_records": 1,
        "max_records": 2,
        "min_columns": 2,
        "max_columns": 2,
        "min_answer_tokens": 1,
    },
    "route_finding": {"min_hops": 2, "max_hops": 2, "min_answer_tokens": 1},
    "arithmetic_search": {
        "min_puzzles": 1,
        "max_puzzles": 1,
        "min_numbers": 3,
        "max_numbers": 3,
        "min_steps": 2,
        "max_steps": 2,
        "min_answer_tokens": 1,
    },
}
TOY_FAMILIES = ("route_finding", "arithmetic_search")
TOY_KNOBS_V2 = {
    "record_extraction": {
        "version": 2,
        "min_records": 2,
        "max_records": 3,
        "min_columns": 2,
        "max_columns": 2,
        "min_answer_tokens": 1,
    },
    "route_finding": {
        "version": 2,
        "min_stations": 4,
        "max_stations": 4,
        "min_lines": 2,
        "max_lines": 2,
        "min_hops": 2,
    },
}
V2_FAMILIES = ("record_extraction", "route_finding")


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def toy() -> SimpleNamespace:
    """Toy thinker data: `toy.data(n, seed)` (two families at toy size), `toy.data_v2(n, seed)`
    (version-2 families), and the knobs and families they are made of."""

    def data(n: int = 2, seed: int = 0) -> DataSpec:
        return DataSpec(families=TOY_FAMILIES, seed=seed, items_per_family=n, knobs=TOY_KNOBS, version="toy")

    def data_v2(n: int = 2, seed: int = 0) -> DataSpec:
        return DataSpec(families=V2_FAMILIES, seed=seed, items_per_family=n, knobs=TOY_KNOBS_V2, version="toy-v2")

    return SimpleNamespace(
        data=data,
        data_v2=data_v2,
        knobs=TOY_KNOBS,
        families=TOY_FAMILIES,
        knobs_v2=TOY_KNOBS_V2,
        families_v2=V2_FAMILIES,
    )
