"""`selfspec_bench.peers`: our SSR modes against the best peer of the same run, paired per sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfspec_bench.peers import (
    FASTER,
    NOISE,
    OURS,
    PEER_MODES,
    SLOWER,
    TOO_FEW,
    peer_comparison,
    peer_section,
    ratio_ci,
)
from selfspec_bench.records import group_records
from selfspec_bench.report import build_report

SAMPLES = [f"s{i}" for i in range(8)]


def _run(record, latencies: dict[str, list[float | None]], **kw) -> list[dict]:
    """Records of one run: mode -> latency per sample of `SAMPLES` (None: the mode lacks that sample)."""
    return [
        record(s, mode, lat, **kw)
        for mode, per_sample in latencies.items()
        for s, lat in zip(SAMPLES, per_sample)
        if lat is not None
    ]


def _one(records: list[dict]) -> dict:
    (group,) = group_records(records)
    comparison = peer_comparison(group)
    assert comparison is not None
    return comparison


def test_ours_are_every_ssr_engine_mode():
    from selfspec_bench.modes import ENGINE_MODES

    assert set(OURS) == set(ENGINE_MODES) - {"baseline", "ssr-off", *PEER_MODES}
    assert {"prefix+suffix", "ssr+think", "ssr+lookup", "ssr+lookup-gated", "iterative-converge"} <= set(OURS)


def test_best_peer_is_the_peer_with_the_highest_paired_speedup(record):
    c = _one(
        _run(
            record,
            {
                "baseline": [10.0] * 8,
                "prompt-lookup": [8.0] * 8,  # 1.25x
                "suffix-decoding": [5.0] * 8,  # 2x: the best peer
                "sps": [9.0] * 8,
                "hf-prompt-lookup": [7.0] * 8,
                "prefix+suffix": [4.0] * 8,
                "ssr-off": [1.0] * 8,  # drafts thrown away: neither ours nor a peer, never the winner
            },
        )
    )
    assert c["best_peer"] == "suffix-decoding" and c["best_peer_speedup"] == pytest.approx(2.0)
    assert c["speedups"]["prompt-lookup"]["speedup"] == pytest.approx(1.25)
    assert "ssr-off" not in c["speedups"] and list(c["ours"]) == ["prefix+suffix"]
    assert c["ours"]["prefix+suffix"]["ratio_vs_best_peer"] == pytest.approx(1.25)
    assert c["winner"] == "prefix+suffix" and c["winner_is_ours"]


def test_ratio_and_interval_use_only_samples_all_three_ran(record):
    base = [10.0] * 8
    peer = [5.0, 5.0, 6.0, 4.0, 5.0, 5.0, 5.0, None]  # lacks s7
    ours = [4.0, 5.0, 4.0, 4.0, 2.5, None, 4.0, 1.0]  # lacks s5; s7 has no peer
    c = _one(_run(record, {"baseline": base, "suffix-decoding": peer, "ssr+think": ours}))
    row = c["ours"]["ssr+think"]
    kept = [(p, o) for p, o in zip(peer, ours) if p is not None and o is not None]
    assert row["n_pairs"] == len(kept) == 6
    assert row["ratio_vs_best_peer"] == pytest.approx(sum(p / o for p, o in kept) / 6)
    assert row["ratio_ci95"] == pytest.approx(ratio_ci(kept))
    # our speedup is the mode table's: every sample ours ran with the baseline, s7 included
    assert row["n_paired"] == 7 and row["speedup"] == pytest.approx(sum(10 / o for o in ours if o) / 7)
    low, high = row["ratio_ci95"]
    assert low <= row["ratio_vs_best_peer"] <= high
    md, _ = peer_section(group_records(_run(record, {"baseline": base, "suffix-decoding": peer, "ssr+think": ours})))
    assert "| 6 | suffix-decoding (2.024x, n=7) | ssr+think | 3.714x, n=7 |" in "\n".join(
        md
    )  # partial runs show their n


def test_verdicts_for_faster_slower_noisy_and_too_few(record):
    c = _one(
        _run(
            record,
            {
                "baseline": [10.0] * 8,
                "prompt-lookup": [5.0] * 8,
                "prefix": [4.0, 4.1, 3.9, 4.0, 4.2, 3.8, 4.0, 4.1],  # ~1.25x the peer on every sample
                "suffix": [6.0, 6.1, 5.9, 6.0, 6.2, 5.8, 6.0, 6.1],  # ~0.83x on every sample
                "prefix+suffix": [2.5, 10.0, 2.5, 10.0, 2.5, 10.0, 5.0, 5.0],  # 2x, 0.5x, ...: noise
                "iterative": [4.0, 4.0, 4.0, None, None, None, None, None],  # three pairs
                "ssr+spec": [4.0, None, None, None, None, None, None, None],  # one pair: no interval
            },
        )
    )
    ours = c["ours"]
    assert ours["prefix"]["verdict"] == FASTER and ours["prefix"]["ratio_ci95"][0] > 1
    assert ours["suffix"]["verdict"] == SLOWER and ours["suffix"]["ratio_ci95"][1] < 1
    low, high = ours["prefix+suffix"]["ratio_ci95"]
    assert ours["prefix+suffix"]["verdict"] == NOISE and low < 1 < high
    assert ours["iterative"]["verdict"] == TOO_FEW and ours["iterative"]["ratio_ci95"] is not None
    assert ours["ssr+spec"]["verdict"] == TOO_FEW and ours["ssr+spec"]["ratio_ci95"] is None
    assert ours["ssr+spec"]["n_pairs"] == 1 and ours["ssr+spec"]["ratio_vs_best_peer"] == pytest.approx(1.25)


def test_winner_may_be_a_peer_or_the_baseline(record):
    peer_wins = _one(_run(record, {"baseline": [10.0] * 8, "sps": [5.0] * 8, "prefix": [8.0] * 8}))
    assert peer_wins["winner"] == "sps" and not peer_wins["winner_is_ours"]
    assert peer_wins["ours"]["prefix"]["verdict"] == SLOWER
    nobody = _one(_run(record, {"baseline": [10.0] * 8, "prompt-lookup": [11.0] * 8, "prefix": [12.0] * 8}))
    assert nobody["winner"] == "baseline" and nobody["winner_speedup"] == pytest.approx(1.0)


def test_runs_without_a_peer_ours_or_baseline_are_skipped(record):
    no_peer = _run(record, {"baseline": [10.0] * 8, "prefix": [5.0] * 8}, model="no-peer")
    no_ours = _run(record, {"baseline": [10.0] * 8, "prompt-lookup": [5.0] * 8, "ssr-off": [9.0] * 8}, model="no-ours")
    no_base = _run(record, {"prompt-lookup": [5.0] * 8, "prefix": [4.0] * 8}, model="no-base")
    groups = group_records(no_peer + no_ours + no_base)
    assert [peer_comparison(g) for g in groups] == [None, None, None]
    md, rows = peer_section(groups)
    assert rows == [] and md[0] == "## Against the best peer"
    assert any(line.startswith("No run has both") for line in md)

    full = _run(record, {"baseline": [10.0] * 8, "prompt-lookup": [5.0] * 8, "prefix": [4.0] * 8}, model="full")
    md, rows = peer_section(group_records(no_peer + full))
    assert [r["model"] for r in rows] == ["full"]
    table = [line for line in "\n".join(md).splitlines() if line.startswith("| ")][1:]  # past the header
    assert len(table) == 1 and "no-peer" not in "\n".join(md)
    assert table[0].startswith("| full / humaneval") and "| prompt-lookup (2.000x) | prefix | 2.500x |" in table[0]
    assert "1.250x [1.250, 1.250] | faster than the best peer | prefix (2.500x) |" in table[0]


def test_report_leads_with_the_section(tmp_path: Path, record, write_records):
    latencies = {"baseline": [10.0] * 8, "suffix+lookup": [5.0] * 8, "prefix+suffix": [4.0] * 8}
    path = build_report([write_records(tmp_path / "r.jsonl", _run(record, latencies))], tmp_path / "rep")
    text = path.read_text()
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads[0] == "## Against the best peer"
    assert heads[1].startswith("## Full SSR (prefix+suffix)")
    assert text.index("## Against the best peer") > text.index("Speedup is the mean over samples")
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    (entry,) = summary["against_best_peer"]
    assert entry["best_peer"] == "suffix+lookup" and entry["winner"] == "prefix+suffix"
    assert entry["ours"]["prefix+suffix"]["verdict"] == FASTER


def test_runs_with_looping_baselines_get_the_comparison_without_them(record):
    """Loops flatter copy-based speculation: the section repeats the comparison without those samples."""
    records = _run(
        record,
        {
            "baseline": [2.0] * 8,
            "prompt-lookup": [0.4, 0.4, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # loops s0, s1 copy well
            "ssr+lookup": [0.8, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
        },
    )
    for r in records:
        if r["mode"] == "baseline" and r["sample_id"] in ("s0", "s1"):
            r["loop"] = True
    (group,) = group_records(records)
    md, comparisons = peer_section([group])
    (c,) = comparisons
    clean = c["without_loops"]
    assert clean["excluded_loop_samples"] == ["s0", "s1"]
    assert clean["ours"]["ssr+lookup"]["n_pairs"] == 6
    assert clean["ours"]["ssr+lookup"]["ratio_vs_best_peer"] > 1.0 > c["ours"]["ssr+lookup"]["ratio_vs_best_peer"]
    assert "Without the samples whose baseline answer is a loop" in "\n".join(md)
    assert peer_comparison(group, exclude=frozenset(SAMPLES)) is None
