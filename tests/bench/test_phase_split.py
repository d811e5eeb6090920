"""`selfspec_bench.phase_split`: our mode against the best peer, the chain of thought and the answer apart."""

from __future__ import annotations

import pytest

from selfspec_bench.phase_split import phase_lines, phase_split
from selfspec_bench.records import Group


def _record(mode: str, sample: str, thinking: float, answer: float) -> dict:
    return {
        "mode": mode,
        "sample_id": sample,
        "thinking_s": thinking,
        "answer_s": answer,
        "latency_s": thinking + answer + 0.1,  # the prompt: in neither phase
    }


def test_the_difference_splits_into_the_two_phases():
    records = []
    for sample, (think, answer) in {"a": (4.0, 1.0), "b": (6.0, 2.0)}.items():
        records += [
            _record("baseline", sample, 2 * think, 3 * answer),
            _record("prompt-lookup", sample, think, answer),
            _record("suffix-decoding", sample, 1.5 * think, answer),  # a weaker peer: not the one compared
            _record("auto", sample, 1.05 * think, 0.5 * answer),
        ]
    split = phase_split(Group("m", "b", {}, records))
    assert list(split) == ["auto"]
    auto = split["auto"]
    assert auto["best_peer"] == "prompt-lookup" and auto["n"] == 2
    assert auto["thinking_ratio"] == pytest.approx(1.05)
    assert auto["answer_ratio"] == pytest.approx(0.5)
    peer_total = 10.0 + 3.0 + 0.2
    assert auto["thinking_share"] == pytest.approx(0.5 / peer_total)
    assert auto["answer_share"] == pytest.approx(-1.5 / peer_total)
    # the shares add up to the latency ratio: the prompt's time is the same on both sides
    assert 1 + auto["thinking_share"] + auto["answer_share"] == pytest.approx(auto["latency_ratio"])
    table = "\n".join(phase_lines(split))
    assert "| auto | prompt-lookup | 2 |" in table and "+3.8%" in table and "-11.4%" in table


def test_no_peer_or_no_phase_times_gives_no_table():
    only_ours = [_record("baseline", "a", 2, 1), _record("auto", "a", 1, 1)]
    assert phase_split(Group("m", "b", {}, only_ours)) == {} and phase_lines({}) == []
    untimed = [{"mode": m, "sample_id": "a", "latency_s": 1.0} for m in ("baseline", "prompt-lookup", "auto")]
    assert phase_split(Group("m", "b", {}, untimed)) == {}
