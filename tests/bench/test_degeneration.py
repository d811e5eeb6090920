"""The loop measures of `selfspec_bench.degeneration`: they catch the degenerate answers seen on
the H200 that the distinct-4-gram ratio let through, and pass every reference answer of the
benchmarks (which a real model should be free to write)."""

from __future__ import annotations

import gzip
import json

import pytest

from selfspec_bench.datasets import humaneval
from selfspec_bench.datasets.classeval import default_path as classeval_path
from selfspec_bench.datasets.longproc import default_data_dir
from selfspec_bench.degeneration import (
    BLOCK_MIN_CHARS,
    COUNTING_MIN_TERMS,
    longest_counting_run,
    loop_kind,
    repeated_block_span,
    text_degeneration,
)
from selfspec_bench.records import load_records
from selfspec_bench.report import build_report

PROSE = (
    "To launch the product, first study the market and name the customers it serves. Then set a "
    "budget, choose the channels that reach those customers, and plan the week of the launch. "
)


def test_counting_runs_are_found_with_any_short_separator():
    assert longest_counting_run(", ".join(str(n) for n in range(11, 428))) == 417
    assert longest_counting_run("".join(f"{n}.\n" for n in range(301, 400))) == 99
    assert longest_counting_run(" ".join(str(n) for n in range(100, 0, -3))) == 34  # counting down, step 3
    assert text_degeneration("Numbers: [" + ", ".join(str(n) for n in range(11, 200))) == "counting run"


def test_numbers_that_do_not_count_are_not_a_run():
    assert longest_counting_run(", ".join(str((n * 37) % 101) for n in range(300))) < 4
    # A numbered list whose items are words: neighbours are too far apart to be counting.
    listing = "".join(f"{n}. Step {n}: move the ball to room {n % 7}.\n" for n in range(1, 200))
    assert longest_counting_run(listing) < COUNTING_MIN_TERMS
    assert text_degeneration(listing) is None


def test_a_loop_that_starts_partway_is_a_repeated_block():
    period, span = repeated_block_span(PROSE * 3 + "S-shaped " * 120)
    assert period == len("S-shaped ") and span >= 120 * len("S-shaped ")
    assert text_degeneration(PROSE * 3 + "S-shaped " * 120) == "repeated block"
    paragraph = PROSE + "It also helps to plan the team's work in advance. "
    assert text_degeneration("Intro. " + paragraph * 4) == "repeated block"


def test_short_repeats_are_not_loops():
    assert text_degeneration(PROSE) is None
    assert text_degeneration("    assert candidate(1) == 1\n" * 10) is None  # 290 characters < 512
    assert repeated_block_span("abc")[1] == 0


def test_loop_kind_prefers_the_recorded_token_measure():
    counting = ", ".join(str(n) for n in range(500))
    assert loop_kind({"answer_distinct4": 0.2, "answer_text": PROSE}) == "distinct-4"
    assert loop_kind({"answer_distinct4": 0.9, "answer_text": counting}) == "counting run"
    assert loop_kind({"answer_distinct4": 0.9, "answer_text": PROSE}) is None
    # A record flagged at run time by a measure whose inputs it does not carry stays flagged.
    assert loop_kind({"loop": True, "loop_kind": "repeated block"}) == "repeated block"


def _references() -> dict[str, list[str]]:
    refs: dict[str, list[str]] = {}
    with gzip.open(humaneval.default_path(), "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    refs["humaneval"] = [p["prompt"] + p["canonical_solution"] for p in problems] + [p["test"] for p in problems]
    if classeval_path().is_file():
        data = json.loads(classeval_path().read_text())
        refs["classeval"] = [c["solution_code"] for c in data] + [c["test"] for c in data]
    fields = {
        "countdown": "demonstration",
        "html_to_tsv": "gt",
        "path_traversal": "answer_nl",
        "tom_tracking": "solution",
    }
    for task, field in fields.items():
        for path in sorted((default_data_dir() / task).glob("*.json")):
            refs[f"longproc/{task}"] = [row[field] for row in json.loads(path.read_text())]
    for path in sorted((default_data_dir() / "pseudo_to_code").glob("*.json")):
        refs["longproc/pseudo_to_code"] = ["\n".join(row["code_lines"]) for row in json.loads(path.read_text())]
    return refs


def test_no_reference_answer_is_judged_a_loop():
    refs = _references()
    for name, texts in refs.items():
        # Each measure stays well inside its threshold, not just under it (seen: at most 173
        # characters of repeated block and 16 counting terms).
        longest_block = max(repeated_block_span(t)[1] for t in texts)
        longest_count = max(longest_counting_run(t) for t in texts)
        assert longest_block < BLOCK_MIN_CHARS // 2, (
            f"{name}: a reference repeats a block over {longest_block} characters"
        )
        assert longest_count < COUNTING_MIN_TERMS // 2, f"{name}: a reference counts {longest_count} numbers in a row"
    if len(refs) < 7:
        pytest.skip("shared datasets not present: only HumanEval's references were checked")


def test_report_reclassifies_old_records_from_their_text(tmp_path):
    """Records written before the text measures existed are re-judged on load, so the report's
    loop-free table leaves out a counting baseline that was written with loop false."""

    def rec(sample: str, mode: str, text: str, latency: float) -> dict:
        return {
            "sample_id": sample,
            "mode": mode,
            "model": "m",
            "benchmark": "b",
            "settings": {"cot_cap": 4},
            "latency_s": latency,
            "answer_text": text,
            "answer_distinct4": 0.9,
            "loop": False,
            "output_hash": "h",
            "exact_match": True,
        }

    counting = ", ".join(str(n) for n in range(200))
    path = tmp_path / "r.jsonl"
    rows = [
        rec("s1", "baseline", counting, 2.0),
        rec("s1", "suffix", counting, 1.0),
        rec("s2", "baseline", PROSE, 2.0),
        rec("s2", "suffix", PROSE, 2.0),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_records([path])
    assert {r["sample_id"]: r["loop_kind"] for r in records if r["mode"] == "baseline"} == {
        "s1": "counting run",
        "s2": None,
    }
    out = tmp_path / "report"
    text = build_report([path], out).read_text()
    assert (
        "1 of 2 samples excluded because their baseline answer is a loop (1 by a counting run of >= 64 numbers)" in text
    )
