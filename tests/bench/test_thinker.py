"""`thinker/<family>` benchmarks (registered by the research part's entry point): held-out generated items, graded by the generators' checkers."""

from __future__ import annotations

import json

import pytest

from selfspec_bench.datasets import available_benchmarks, load_benchmark
from selfspec_bench.scoring import score
from selfspec_research.thinker.tasks import families

THINKER_FAMILIES = ("class_synthesis", "record_extraction", "route_finding", "arithmetic_search")


def test_every_family_is_a_benchmark_through_the_entry_point():
    assert set(THINKER_FAMILIES) == set(families())
    assert all(f"thinker/{f}" in available_benchmarks() for f in THINKER_FAMILIES)


@pytest.mark.parametrize("family", THINKER_FAMILIES)
def test_reference_answers_pass_and_garbage_fails(family):
    samples = load_benchmark(f"thinker/{family}", limit=2, offset=3)
    assert [s.id for s in samples] == [f"{family}-v1-s1000-i3", f"{family}-v1-s1000-i4"]
    for s in samples:
        assert s.messages[0]["role"] == "user" and s.messages[0]["content"]
        assert score(s, s.reference["item"]["answer"]).passed
        assert not score(s, "no idea").passed


def test_items_from_a_file_and_training_seed_refused(tmp_path):
    samples = load_benchmark("thinker/route_finding", limit=3)
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(s.reference["item"]) for s in samples) + "\n")
    again = load_benchmark("thinker/route_finding", path=path, limit=2, offset=1)
    assert [s.id for s in again] == [s.id for s in samples[1:3]]
    with pytest.raises(ValueError, match="training stream"):
        load_benchmark("thinker/route_finding", seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_benchmark("thinker/route_finding", path=bad)
