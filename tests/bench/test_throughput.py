"""`selfspec_bench.throughput`: a batched run's output tokens per second of wall time, per mode."""

from __future__ import annotations

import pytest

from selfspec_bench.records import Group
from selfspec_bench.throughput import batch_throughput, throughput_lines


def _rec(mode: str, sample: str, tokens: int, latency: float, **extra) -> dict:
    return {"mode": mode, "sample_id": sample, "output_tokens": tokens, "latency_s": latency, **extra}


def test_tokens_over_the_batches_wall_times_against_the_baseline_and_the_best_peer():
    records = []
    for mode, walls in (("baseline", (4.0, 2.0)), ("prompt-lookup", (3.0, 1.0)), ("auto", (2.0, 1.0))):
        for batch, wall in enumerate(walls):
            for j in range(2):  # two requests per batch, 100 tokens each
                records.append(_rec(mode, f"s{batch}{j}", 100, wall * 0.9, batch=batch, batch_wall_s=wall))
    table = batch_throughput(Group("m", "b", {"concurrency": 2}, records))
    assert list(table) == ["baseline", "prompt-lookup", "auto"]
    assert table["baseline"]["tokens_per_s"] == pytest.approx(400 / 6.0)
    assert table["auto"]["batches"] == 2 and table["auto"]["requests"] == 4
    assert table["auto"]["vs_baseline"] == pytest.approx(6.0 / 3.0)
    assert table["auto"]["vs_best_peer"] == pytest.approx(4.0 / 3.0)
    assert table["prompt-lookup"]["vs_best_peer"] is None  # a peer is not compared with itself
    text = "\n".join(throughput_lines(table))
    assert "### Throughput under load" in text and "best peer by throughput: prompt-lookup" in text


def test_older_records_count_one_batch_by_its_longest_request_or_are_left_out():
    one_batch = [_rec("auto", "a", 50, 1.0), _rec("auto", "b", 50, 2.0)]
    several = [_rec("baseline", s, 50, 1.0) for s in "abc"]  # three records at concurrency 2: two batches
    table = batch_throughput(Group("m", "b", {"concurrency": 2}, one_batch + several))
    assert list(table) == ["auto"]
    assert table["auto"]["wall_s"] == 2.0 and table["auto"]["tokens_per_s"] == pytest.approx(50.0)
    assert table["auto"]["vs_baseline"] is None


def test_runs_of_one_request_at_a_time_have_no_throughput_section():
    group = Group("m", "b", {"concurrency": 1}, [_rec("auto", "a", 50, 1.0)])
    assert batch_throughput(group) == {} and throughput_lines({}) == []
