"""Tests for the thinker task generators and checkers (selfspec_research.thinker.tasks)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time

import pytest

from selfspec_research.thinker.tasks import (
    TaskItem,
    check,
    check_many,
    estimate_tokens,
    families,
    format_training_text,
    generate,
    generate_split,
    get_family,
    ordered_line_coverage,
)
from selfspec_research.thinker.tasks.arithmetic_search import ArithmeticSearch
from selfspec_research.thinker.tasks.class_concepts import CONCEPTS
from selfspec_research.thinker.tasks.class_spec import Draw
from selfspec_research.thinker.tasks.class_synthesis import (
    ClassSynthesis,
    _class_code,
    _reference_outcomes,
    _render_method,
)
from selfspec_research.thinker.tasks.pyexec import UnitTest, run_class_tests
from selfspec_research.thinker.tasks.route_finding import (
    RouteFinding,
    shortest_paths,
)

N_ITEMS = 50
FAMILIES = ("class_synthesis", "record_extraction", "route_finding", "arithmetic_search")


@pytest.fixture(scope="module")
def samples() -> dict[str, list[TaskItem]]:
    """50 default items per family from one seed, generated once for the module."""
    return {name: [generate(name, seed=11, index=i) for i in range(N_ITEMS)] for name in FAMILIES}


def _item_digest(item: TaskItem) -> str:
    return hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------------- registry
def test_registry_lists_the_four_families_and_rejects_unknown_names() -> None:
    assert families() == list(FAMILIES)
    assert isinstance(get_family("route_finding"), RouteFinding)
    with pytest.raises(KeyError, match="unknown task family"):
        get_family("sudoku")


def test_generate_split_gives_n_per_family_interleaved_and_seeds_give_disjoint_splits() -> None:
    train = generate_split(["route_finding", "arithmetic_search"], seed=1, n=6)
    held_out = generate_split(["route_finding", "arithmetic_search"], seed=2, n=6)
    assert [item.family for item in train[:4]] == ["route_finding", "arithmetic_search"] * 2
    assert sum(item.family == "route_finding" for item in train) == 6
    assert [item.index for item in train if item.family == "arithmetic_search"] == list(range(6))
    assert not {item.prompt for item in train} & {item.prompt for item in held_out}
    assert (
        generate_split("route_finding", seed=1, n=2) == [item for item in train if item.family == "route_finding"][:2]
    )


def test_knobs_change_difficulty_and_bad_knobs_are_refused() -> None:
    short_routes = RouteFinding(min_hops=5, max_hops=6, min_answer_tokens=0)
    assert {short_routes.generate(0, i).meta["shortest_hops"] for i in range(10)} <= {5, 6}
    wide_class = ClassSynthesis(min_methods=10, max_methods=10)
    assert len(wide_class.generate(0, 0).meta["methods"]) == 10
    with pytest.raises(ValueError):
        ClassSynthesis(max_methods=11)
    assert generate("class_synthesis", 0, 0) != generate("class_synthesis", 0, 0, min_methods=4, max_methods=4)
    with pytest.raises(ValueError):
        ArithmeticSearch(min_numbers=3, min_steps=3, max_steps=3)
    with pytest.raises(ValueError):
        RouteFinding(min_hops=9, max_hops=4)


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_and_index_give_the_same_item_and_other_seeds_differ(family: str) -> None:
    first, again = generate(family, 5, 3), generate(family, 5, 3)
    assert first == again
    assert (first.family, first.seed, first.index, first.version) == (family, 5, 3, get_family(family).version)
    assert generate(family, 6, 3).prompt != first.prompt
    assert generate(family, 5, 4).prompt != first.prompt


def test_items_reproduce_in_another_process_with_another_hash_seed() -> None:
    code = (
        "import hashlib, json\n"
        "from selfspec_research.thinker.tasks import generate, families\n"
        "for name in families():\n"
        "    item = generate(name, 21, 4)\n"
        "    print(hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60)
    here = [_item_digest(generate(name, 21, 4)) for name in families()]
    assert out.stdout.split() == here


@pytest.mark.parametrize("family", FAMILIES)
def test_items_are_mostly_distinct(family: str, samples: dict[str, list[TaskItem]]) -> None:
    items = samples[family]
    assert len({item.prompt for item in items}) == len(items)
    assert len({item.answer for item in items}) >= 0.95 * len(items)


def test_items_round_trip_through_json_and_still_check() -> None:
    for name in FAMILIES:
        item = generate(name, 3, 1)
        restored = TaskItem.from_dict(json.loads(json.dumps(item.to_dict())))
        assert restored == item
        assert check(restored, restored.answer).passed


# -------------------------------------------------------------- lengths and CoT
@pytest.mark.parametrize("family", FAMILIES)
def test_answer_and_prompt_lengths_are_in_range(family: str, samples: dict[str, list[TaskItem]]) -> None:
    answers = [estimate_tokens(item.answer) for item in samples[family]]
    prompts = [estimate_tokens(item.prompt) for item in samples[family]]
    cots = [estimate_tokens(item.cot) for item in samples[family]]
    assert min(answers) >= 190 and max(answers) <= 2000, (min(answers), max(answers))
    assert statistics.median(answers) >= 200
    assert 100 <= min(prompts) and max(prompts) <= 6000, (min(prompts), max(prompts))
    assert all(cot > answer for cot, answer in zip(cots, answers))  # the CoT does the work


@pytest.mark.parametrize("family", FAMILIES)
def test_cot_holds_the_answer_pieces_in_order_without_copying_the_answer(
    family: str, samples: dict[str, list[TaskItem]]
) -> None:
    coverage = [ordered_line_coverage(item.answer, item.cot) for item in samples[family]]
    assert min(coverage) >= 0.8, min(coverage)
    for item in samples[family]:
        assert item.answer not in item.cot
        # the answer's first piece is written early in the CoT, its last piece late
        lines = [line.strip() for line in item.answer.splitlines() if line.strip() and not line.startswith("```")]
        first, last = item.cot.find(lines[1]), item.cot.rfind(lines[-1])
        assert 0 <= first < len(item.cot) / 2 < last, (family, item.index)


def test_ordered_line_coverage_counts_lines_in_order_only() -> None:
    answer = "a\nb\nc\nd"
    assert ordered_line_coverage(answer, "note\na\nx\nb\n  c\nd\n") == 1.0
    assert ordered_line_coverage(answer, "d\nc\nb\na") == 0.25
    assert ordered_line_coverage(answer, "a\na\na\nb") == 0.5
    assert ordered_line_coverage("", "anything") == 1.0


def test_format_training_text_wraps_the_cot_in_think_tags() -> None:
    item = generate("arithmetic_search", 0, 0)
    messages, target = format_training_text(item)
    assert messages == [{"role": "user", "content": item.prompt}]
    assert target == f"<think>\n{item.cot}\n</think>\n\n{item.answer}"
    assert check(item, target).passed  # checkers read the answer after </think>


# ------------------------------------------------------- checkers accept references
@pytest.mark.parametrize("family", FAMILIES)
def test_checker_accepts_the_reference_answers(family: str, samples: dict[str, list[TaskItem]]) -> None:
    items = samples[family]
    results = check_many(items, [item.answer for item in items])
    failures = [(item.index, result.detail) for item, result in zip(items, results) if not result.passed]
    assert not failures
    assert all(result.score == 1.0 for result in results)


# ------------------------------------------------------ checkers reject corruptions
def _python_block(answer: str) -> str:
    return answer.removeprefix("```python\n").removesuffix("```")


def _break_last_method(code: str, mode: str) -> str:
    lines = code.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("    def "))
    if mode == "rename":
        lines[start] = lines[start].replace("def ", "def old_", 1)
        return "\n".join(lines)
    return "\n".join(lines[: start + 1] + ["        raise RuntimeError('not done')"])


def test_class_checker_rejects_broken_methods(samples: dict[str, list[TaskItem]]) -> None:
    items = samples["class_synthesis"]
    broken = [
        f"```python\n{_break_last_method(_python_block(item.answer), mode)}```"
        for item in items
        for mode in ("rename", "body")
    ]
    results = check_many([item for item in items for _ in range(2)], broken)
    assert not any(result.passed for result in results)
    assert all(0.0 < result.score < 1.0 for result in results)


def test_class_checker_handles_missing_classes_and_code_without_fences() -> None:
    item = generate("class_synthesis", 2, 2)
    code = _python_block(item.answer)
    verdicts = check_many(
        [item] * 3, [code, "no code here", code.replace(f"class {item.meta['class_name']}", "class Other")]
    )
    assert verdicts[0].passed
    assert not verdicts[1].passed and verdicts[1].score == 0.0
    assert not verdicts[2].passed and "not defined" in verdicts[2].detail


def test_record_checker_rejects_dropped_swapped_and_altered_rows(samples: dict[str, list[TaskItem]]) -> None:
    for item in samples["record_extraction"]:
        header, *rows = item.answer.split("\n")
        n = len(rows)
        dropped = check(item, "\n".join([header, *rows[:-1]]))
        assert not dropped.passed
        assert dropped.score == pytest.approx(2 * (n - 1) / (2 * n - 1))
        swapped = check(item, "\n".join([header, rows[1], rows[0], *rows[2:]]))
        assert not swapped.passed and swapped.score == 1.0 and "order" in swapped.detail
        cells = rows[0].split("\t")
        cells[-1] = cells[-1] + "0"
        altered = check(item, "\n".join([header, "\t".join(cells), *rows[1:]]))
        assert not altered.passed and altered.score < 1.0
        assert not check(item, "\n".join(["\t".join(reversed(header.split("\t"))), *rows])).passed


def test_record_checker_ignores_text_around_the_table() -> None:
    item = generate("record_extraction", 4, 0)
    wrapped = f"<think>\nnotes\n</think>\n\nHere is the table:\n```tsv\n{item.answer}\n```\nDone."
    assert check(item, wrapped).passed
    assert not check(item, "no table at all").passed


def test_route_checker_rejects_swapped_and_invented_hops(samples: dict[str, list[TaskItem]]) -> None:
    for item in samples["route_finding"]:
        hops = item.answer.split("\n")
        swapped = check(item, "\n".join([hops[1], hops[0], *hops[2:]]))
        assert not swapped.passed and swapped.score < 1.0
        invented = hops[3].rsplit(" to ", 1)[0] + " to Nowhere Central"
        assert not check(item, "\n".join([*hops[:3], invented, *hops[4:]])).passed
        assert not check(item, "\n".join(hops[:-1])).passed  # stops short of the goal


def test_route_checker_accepts_any_shortest_route_and_rejects_longer_valid_ones() -> None:
    lines = {"Red Line": ["A", "B", "C"], "Bus 4": ["A", "D", "E", "C"], "Bus 5": ["A", "F", "C"]}
    assert shortest_paths(lines, "A", "C") == (2, 2)
    item = TaskItem(
        "route_finding",
        1,
        0,
        0,
        "",
        "",
        "",
        {"lines": lines, "start": "A", "goal": "C", "shortest_hops": 2, "route": ["A", "B", "C"]},
    )
    family = get_family("route_finding")
    assert family.check(item, "From A take the Red Line to B\nFrom B take the Red Line to C").passed
    assert family.check(item, "From A take Bus 5 to F\nFrom F take Bus 5 to C.").passed
    longer = family.check(item, "From A take Bus 4 to D\nFrom D take Bus 4 to E\nFrom E take Bus 4 to C")
    assert not longer.passed and "shortest has 2" in longer.detail
    wrong_line = family.check(item, "From A take Bus 4 to B\nFrom B take the Red Line to C")
    assert not wrong_line.passed and "does not go" in wrong_line.detail


def test_arithmetic_checker_rejects_broken_equations(samples: dict[str, list[TaskItem]]) -> None:
    for item in samples["arithmetic_search"]:
        lines = item.answer.split("\n")
        equation_rows = [i for i, line in enumerate(lines) if "=" in line]
        first = equation_rows[0]
        left, result = lines[first].rsplit(" = ", 1)
        wrong = lines[:first] + [f"{left} = {int(result) + 1}"] + lines[first + 1 :]
        verdict = check(item, "\n".join(wrong))
        assert not verdict.passed and verdict.score < 1.0
        truncated = [line for i, line in enumerate(lines) if i != equation_rows[-1]]
        assert not check(item, "\n".join(truncated)).passed  # last puzzle no longer reaches its target


def test_arithmetic_checker_enforces_use_at_most_once() -> None:
    item = TaskItem("arithmetic_search", 1, 0, 0, "", "", "", {"puzzles": [{"numbers": [5, 3, 2], "target": 25}]})
    family = get_family("arithmetic_search")
    assert not family.check(item, "Puzzle 1: target 25\n5 * 5 = 25").passed  # only one 5
    assert family.check(item, "Puzzle 1: target 25\n3 + 2 = 5\n5 * 5 = 25").passed  # the result is a second 5
    assert not family.check(item, "Puzzle 1: target 25\n3 + 2 = 5\n5 * 5 = 25\n25 - 5 = 20").passed
    assert not family.check(item, "Puzzle 1: target 25\n5 - 3 = 2\n2 / 4 = 0").passed


# --------------------------------------------------------- class concept integrity
def test_every_method_works_alone_and_has_a_non_raising_probe() -> None:
    """Any method subset must be a valid class: each probe may use only its own method."""
    for concept in CONCEPTS:
        for spec in concept.methods:
            rng = random.Random(f"{concept.key}.{spec.name}")
            subs = {"cls": concept.class_names[0], "o": concept.var}
            subs.update({key: rng.choice(options) for key, options in concept.attrs.items()})
            code = _class_code(
                subs["cls"], concept.summary, [_render_method(concept.init, subs), _render_method(spec, subs)]
            )
            draw = Draw(rng)
            tests = ClassSynthesis._draw_tests(concept, spec, draw, subs)
            resolved = _reference_outcomes(code, subs["cls"], tests)
            assert any(test.raises is None for test in resolved), (concept.key, spec.name)


def test_pyexec_survives_runaway_and_exiting_answers() -> None:
    good = "class K:\n    def f(self):\n        return 1\n"
    loop = "class K:\n    def f(self):\n        while True:\n            pass\n"
    exits = "import os\nclass K:\n    def f(self):\n        os._exit(3)\n"
    noisy = "class K:\n    def f(self):\n        print('x' * 100000)\n        return 1\n"
    test = [UnitTest(("k = K()",), "k.f()", "1")]
    started = time.monotonic()
    results = run_class_tests([good, loop, exits, noisy, good], ["K"] * 5, [test] * 5, job_timeout_s=1.0)
    assert [result.passed for result in results] == [[True], [False], [False], [True], [True]]
    assert "timed out" in results[1].errors[0]
    assert time.monotonic() - started < 15
