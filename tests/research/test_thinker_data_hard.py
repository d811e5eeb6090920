"""thinker-data-hard-v1 and -v2: the latest family versions with larger knobs, so that the
thinker fails some items (CoSpec's complementarity needs items a draft can solve in its
place). Knobs only: the items must stay deterministic, checkable and mostly within the
thinker's context, and each level must be longer than the one before."""

from __future__ import annotations

import statistics

import pytest

from selfspec_research.thinker.data_versions import (
    DATA_VERSION_HARD_V1,
    DATA_VERSION_HARD_V2,
    DATA_VERSION_V3,
    DATA_VERSION_V4,
    DATA_VERSIONS,
    HARD_DATA_VERSIONS,
    data_version_knobs,
)
from selfspec_research.thinker.tasks import TaskItem, check_many, families, format_training_text, generate

HARD = HARD_DATA_VERSIONS
LEVELS = (DATA_VERSION_V3, *HARD)


def _items(version: str, family: str, seeds: range, indices: tuple[int, ...] = (0,)) -> list[TaskItem]:
    knobs = data_version_knobs(version)[family]
    return [generate(family, seed, index, **knobs) for seed in seeds for index in indices]


def test_hard_versions_use_the_latest_family_versions_with_other_knobs_only() -> None:
    assert HARD == (DATA_VERSION_HARD_V1, DATA_VERSION_HARD_V2) == ("thinker-data-hard-v1", "thinker-data-hard-v2")
    latest = DATA_VERSIONS[DATA_VERSION_V4]
    for version in HARD:
        knobs = DATA_VERSIONS[version]
        assert set(knobs) == set(families())
        for family, values in knobs.items():
            assert values["version"] == latest[family]["version"]
            assert set(values) == set(latest[family]), f"{version} {family}: knobs the family does not take"
            assert values != latest[family]


@pytest.mark.parametrize("version", HARD)
@pytest.mark.parametrize("family", families())
def test_hard_items_are_deterministic_and_the_checker_accepts_every_reference(version: str, family: str) -> None:
    items = _items(version, family, range(20))
    assert items == _items(version, family, range(20))
    bare = check_many(items, [item.answer for item in items])
    assert [(item.uid, r.detail) for item, r in zip(items, bare) if not r.passed] == []
    full = check_many(items, [format_training_text(item)[1] for item in items])  # with the CoT before it
    assert all(result.passed and result.score == 1.0 for result in full)


@pytest.mark.parametrize("family", families())
def test_reference_traces_grow_from_v3_to_hard_v1_to_hard_v2(family: str) -> None:
    """Mean characters of prompt + CoT + answer (tokens follow characters closely for these texts)."""
    means = [
        statistics.mean(len(item.prompt) + len(item.cot) + len(item.answer) for item in _items(v, family, range(12)))
        for v in LEVELS
    ]
    assert means[0] < means[1] < means[2], dict(zip(LEVELS, means))
