"""thinker-data-v4: v3's items with CoTs whose wording varies (class synthesis 2, record
extraction 3, route finding 4, arithmetic search 3), and the copy measure that compares them.

The new versions must keep what the testbed relies on (the same prompts, answers and
checker as v3, every answer line in the CoT in order, determinism per seed) while the CoT
stops being one template: several phrasings per step, shuffled independent steps, no
restated prompt sentences."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from selfspec_research.thinker.copying import (
    copy_stats,
    covered,
    ngrams,
    prompt_copy_share,
    template_reuse_shares,
    tokenize,
)
from selfspec_research.thinker.data_versions import DATA_VERSION_V4, DATA_VERSIONS, data_version_knobs
from selfspec_research.thinker.examples import DataSpec
from selfspec_research.thinker.tasks import (
    TaskItem,
    check_many,
    families,
    format_training_text,
    generate,
    get_family,
    ordered_line_coverage,
)
from selfspec_research.thinker.tasks.arithmetic_search import V2_OPERATORS, apply, search_branches
from selfspec_research.thinker.tasks.wording import ordinal, spoken_list

V3 = "thinker-data-v3"
NEW_VERSIONS = {"class_synthesis": 2, "record_extraction": 3, "route_finding": 4, "arithmetic_search": 3}


def _items(version: str, family: str, seed: int, n: int) -> list[TaskItem]:
    knobs = data_version_knobs(version)[family]
    return [generate(family, seed, index, **knobs) for index in range(n)]


@pytest.fixture(scope="module")
def v4_samples() -> dict[str, list[TaskItem]]:
    """30 v4 items per family from one seed."""
    return {family: _items(DATA_VERSION_V4, family, 1000, 30) for family in families()}


def _masked(text: str) -> str:
    """A sentence with its item-specific parts (code spans, numbers, ordinals) blanked out,
    so what is left is the phrasing."""
    text = re.sub(r"`[^`]*`", "`_`", text)
    text = re.sub(r"\b\d+(st|nd|rd|th)\b", "#", text)
    return re.sub(r"\d+", "#", text)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.:!?])\s", text, maxsplit=1)[0]


# ------------------------------------------------------------------------ registration
def test_v4_is_v3_with_the_reworded_family_versions() -> None:
    v4 = DATA_VERSIONS[DATA_VERSION_V4]
    assert DATA_VERSION_V4 == "thinker-data-v4" and set(v4) == set(families())
    for family, version in NEW_VERSIONS.items():
        assert v4[family] == {**DATA_VERSIONS[V3][family], "version": version}
        assert get_family(family, version=version).stream_version == DATA_VERSIONS[V3][family].get("version", 1)
    spec = DataSpec.for_version(DATA_VERSION_V4, items_per_family=1, seed=3)
    assert {(item.family, item.version) for item in spec.items()} == set(NEW_VERSIONS.items())


@pytest.mark.parametrize("family", list(NEW_VERSIONS))
def test_v4_items_have_v3_prompts_answers_and_checker_data(family: str) -> None:
    for seed in (0, 1000):
        for old, new in zip(_items(V3, family, seed, 8), _items(DATA_VERSION_V4, family, seed, 8)):
            assert (new.prompt, new.answer, new.meta) == (old.prompt, old.answer, old.meta)
            assert new.uid == old.uid.replace(f"-v{old.version}-", f"-v{new.version}-")
            assert new.cot != old.cot


@pytest.mark.parametrize("family", list(NEW_VERSIONS))
def test_v4_items_are_deterministic_per_seed(family: str) -> None:
    knobs = data_version_knobs(DATA_VERSION_V4)[family]
    first = generate(family, 5, 3, **knobs)
    assert first == generate(family, 5, 3, **knobs)
    assert generate(family, 6, 3, **knobs).cot != first.cot
    assert generate(family, 5, 4, **knobs).cot != first.cot


def test_v4_items_reproduce_in_another_process_with_another_hash_seed() -> None:
    code = (
        "import hashlib, json\n"
        "from selfspec_research.thinker.examples import DataSpec\n"
        "for item in DataSpec.for_version('thinker-data-v4', seed=21, items_per_family=2).items():\n"
        "    print(hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "4321"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=90)
    here = [
        hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest()
        for item in DataSpec.for_version(DATA_VERSION_V4, seed=21, items_per_family=2).items()
    ]
    assert out.stdout.split() == here


# ------------------------------------------------------------------ answers and checker
@pytest.mark.parametrize("family", list(NEW_VERSIONS))
def test_v4_checker_accepts_every_reference_answer_for_20_seeds(family: str) -> None:
    knobs = data_version_knobs(DATA_VERSION_V4)[family]
    items = [generate(family, seed, index, **knobs) for seed in range(20) for index in (0, 1)]
    bare = check_many(items, [item.answer for item in items])
    assert [(item.uid, r.detail) for item, r in zip(items, bare) if not r.passed] == []
    full = check_many(items, [format_training_text(item)[1] for item in items])  # with the CoT before it
    assert all(result.passed and result.score == 1.0 for result in full)


@pytest.mark.parametrize("family", list(NEW_VERSIONS))
def test_v4_cot_holds_every_answer_line_in_order(family: str, v4_samples: dict[str, list[TaskItem]]) -> None:
    for item in v4_samples[family]:
        answer = "\n".join(line for line in item.answer.splitlines() if not line.startswith("```"))  # the fence
        assert ordered_line_coverage(answer, item.cot) == 1.0, item.uid


# --------------------------------------------------------------------- varied wording
def _step_phrasings(family: str, items: list[TaskItem]) -> Counter:
    """The masked phrasing of one recurring step per family: a method's lead (class), a
    record's lead (records), a visit's lead (routes), the numbers line of a puzzle
    (arithmetic)."""
    shapes: Counter = Counter()
    for item in items:
        blocks = item.cot.split("\n\n")
        if family == "class_synthesis":
            shapes.update(_masked(_first_sentence(b)) for b in blocks if "\n    def " in b and "__init__" not in b)
        elif family == "record_extraction":
            entity = r"\b(staff member|product|event|book|flight|restaurant)s?\b"
            shapes.update(re.sub(entity, "E", _masked(b.splitlines()[0]), flags=re.I) for b in blocks[3:-1])
        elif family == "route_finding":
            stations = sorted({s for stops in item.meta["lines"].values() for s in stops}, key=len, reverse=True)
            for block in blocks[1:-2]:
                lead = block.splitlines()[0]
                for station in stations:
                    lead = lead.replace(station, "S")
                shapes[lead] += 1
        else:
            shapes.update(_masked(b.splitlines()[1]) for b in blocks[1:-1])
    return shapes


@pytest.mark.parametrize("family", list(NEW_VERSIONS))
def test_v4_cots_word_the_same_step_several_ways(family: str, v4_samples: dict[str, list[TaskItem]]) -> None:
    items = v4_samples[family]
    assert len({_masked(_first_sentence(item.cot)) for item in items}) >= 3
    shapes = _step_phrasings(family, items)
    assert len(shapes) >= 3, shapes
    assert max(shapes.values()) < 0.6 * sum(shapes.values()), shapes  # no phrasing dominates
    v3_items = _items(V3, family, 1000, 30)
    assert len(_step_phrasings(family, v3_items)) < len(shapes)


def test_v4_shuffles_steps_whose_order_does_not_matter(v4_samples: dict[str, list[TaskItem]]) -> None:
    # record plans: the format and the filter sentence come in either order
    openings = {item.cot.split(" ", 2)[0] for item in v4_samples["record_extraction"]}
    assert len(openings) >= 4
    # route visits: the reached set is not always listed in the order it was reached
    reached = [
        line.split(": ", 1)[1].split(", ")
        for item in v4_samples["route_finding"]
        for line in item.cot.splitlines()
        if line.startswith(("Reached: ", "Reached so far: ", "Seen: ", "Known stations now: "))
    ]
    assert len({tuple(names) for names in reached}) > 1 and any(names[0] != names[-1] for names in reached)
    # arithmetic: the second operations of a branch are tried in several orders, the hit unchanged
    orders = Counter()
    for item in v4_samples["arithmetic_search"]:
        for line in item.cot.splitlines():
            ops = re.findall(r"\d+ ([-+*]) \d+(?: = \d+| not allowed| would not be positive| is out)", line)
            if len(ops) == 4:  # a complete branch: the first operation and three tries
                orders[tuple(ops[1:])] += 1
    assert len(orders) >= 4
    for numbers, target in ((8, 1, 5), 45), ((2, 1, 8), 16):
        assert (
            search_branches(numbers, target, lambda: list(reversed(V2_OPERATORS)))[1]
            == (search_branches(numbers, target)[1])
        )


def test_v4_cots_do_not_restate_the_prompt(v4_samples: dict[str, list[TaskItem]]) -> None:
    for item in v4_samples["route_finding"]:  # no line of the network copied
        for line, stops in item.meta["lines"].items():
            assert " - ".join(stops) not in item.cot
    for item in v4_samples["record_extraction"]:  # the filter is paraphrased
        if item.meta["filter"]:
            assert item.meta["filter"] not in item.cot
    for item in v4_samples["class_synthesis"]:  # the spec is said in other words (the code keeps its docstrings)
        docs = re.findall(r"^\d+\. `[^`]+`: (.+)$", item.prompt, flags=re.MULTILINE)
        code = {line.strip() for line in item.answer.splitlines()}
        notes = "\n".join(line for line in item.cot.splitlines() if line.strip() not in code)
        assert docs and not any(doc in notes or doc[0].lower() + doc[1:] in notes for doc in docs)
    v3_class = _items(V3, "class_synthesis", 1000, 5)
    assert all(re.search(r"(The spec says|It should|What it must do): ", item.cot) for item in v3_class)
    for item in v4_samples["arithmetic_search"]:
        assert not any(line in item.cot for line in item.prompt.splitlines() if line.startswith("Puzzle "))


def test_v4_arithmetic_tries_are_correct() -> None:
    equation = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")
    for item in _items(DATA_VERSION_V4, "arithmetic_search", 3, 20):
        for left, op, right, result in equation.findall(item.cot):
            assert apply(int(left), op, int(right)) == int(result), item.uid


# ------------------------------------------------------------------------ copy measure
def test_copy_measure_on_hand_written_strings() -> None:
    assert ngrams("a b c d".split(), 3) == {("a", "b", "c"), ("b", "c", "d")}
    assert covered("a b c d e".split(), {("b", "c", "d")}, 3) == [False, True, True, True, False]
    # ten CoT words, the first eight also in the prompt in a row: 8/10 copied
    assert prompt_copy_share("a b c d e f g h x y", "q a b c d e f g h") == pytest.approx(0.8)
    assert prompt_copy_share("a b c d e f g x y z", "a b c d e f g") == 0.0  # a run of 7 is no 8-gram
    assert prompt_copy_share("a b c d", "b c d", n=3) == pytest.approx(0.75)
    assert prompt_copy_share("", "a b c") == 0.0
    # an n-gram counts for template reuse only when another text holds it
    shares = template_reuse_shares(["a b c d e", "x b c d y", "p q r s t", "p q r u v"], n=3)
    assert shares == pytest.approx([0.6, 0.6, 0.6, 0.6])
    assert template_reuse_shares(["a b c a b c", "x y z"], n=3) == [0.0, 0.0]  # repeats within one text do not


class _CharTokenizer:
    """One token per character: enough to show the measure counts a tokenizer's ids."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(ch) for ch in text]


def test_copy_measure_counts_tokenizer_ids_and_answer_lines() -> None:
    assert prompt_copy_share("abcdefghij", "zzabcdefgh", tokenizer=_CharTokenizer()) == pytest.approx(0.8)
    marked = tokenize("note here\nROW 1\n\nROW 2", answer="ROW 1\nROW 2\n")
    assert marked.ids == ("note", "here", "ROW", "1", "ROW", "2") and marked.in_answer == (
        False,
        False,
        True,
        True,
        True,
        True,
    )
    items = [TaskItem("toy", 1, 0, k, "w1 w2 w3 w4", f"w1 w2 w3 n{k}\nrow {k}", f"row {k}", {}) for k in range(2)]
    stats = copy_stats(items, n=3)["toy"]
    assert stats["items"] == 2 and stats["cot_tokens"] == 6.0
    share = {key: pytest.approx(value, abs=1e-4) for key, value in {"third": 1 / 3, "half": 1 / 2}.items()}
    assert stats["answer_line_share"] == share["third"]
    assert stats["prompt_copy"] == share["half"] and stats["prompt_copy_notes"] == 0.75
    assert stats["template_reuse"] == share["half"] and stats["template_reuse_notes"] == 0.75
    assert stats["copyable"] == share["half"] and stats["copyable_notes"] == 0.75  # the same three words


def test_v4_cots_copy_less_than_v3() -> None:
    """What the README's table says, on fewer items: less template reuse and prompt copying."""
    old = copy_stats(DataSpec.for_version(V3, seed=1000, items_per_family=20).items())
    new = copy_stats(DataSpec.for_version(DATA_VERSION_V4, seed=1000, items_per_family=20).items())
    for family in families():
        assert new[family]["template_reuse_notes"] < 0.6 * old[family]["template_reuse_notes"], family
        assert new[family]["template_reuse"] < old[family]["template_reuse"], family
        assert new[family]["prompt_copy"] <= old[family]["prompt_copy"], family
        assert new[family]["prompt_copy_notes"] <= 0.1, family
        assert new[family]["copyable"] < 0.8 * old[family]["copyable"], family
    assert old["route_finding"]["prompt_copy"] > 0.1 and new["route_finding"]["prompt_copy"] == 0.0


def test_wording_helpers() -> None:
    import random

    assert [ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
    ]
    rng = random.Random(0)
    assert spoken_list(rng, ["a"]) == "a" and spoken_list(rng, ["a", "b"], last="or") == "a or b"
    assert {spoken_list(random.Random(seed), ["a", "b", "c"]) for seed in range(30)} == {
        "a, b and c",
        "a, b, c",
        "a, b, and c",
    }


def test_every_class_method_has_a_summary_in_other_words() -> None:
    """The summaries class synthesis version 2 says instead of the spec: one per method and
    constructor, filled for every attribute-name choice, and no 8-word run of its doc."""
    from string import Template

    from selfspec_research.thinker.tasks.class_concepts import CONCEPTS

    for concept in CONCEPTS:
        for spec in (concept.init, *concept.methods):
            assert spec.summary and spec.summary[0].islower(), (concept.key, spec.name)
            for choice in range(max((len(options) for options in concept.attrs.values()), default=1)):
                subs = {key: options[choice % len(options)] for key, options in concept.attrs.items()}
                filled = Template(spec.summary).substitute({"cls": "C", "o": "o", **subs})
                doc = Template(spec.doc).substitute({"cls": "C", "o": "o", **subs})
                assert not ngrams(filled.split(), 8) & ngrams(doc.split(), 8), (concept.key, spec.name)


def test_v4_reference_traces_do_not_loop() -> None:
    from selfspec.testing.tiny import tiny_tokenizer
    from selfspec_research.thinker.measures import has_loop

    tokenizer = tiny_tokenizer()
    for item in DataSpec.for_version(DATA_VERSION_V4, seed=4, items_per_family=8).items():
        ids = tokenizer.encode(f"{item.cot}\n</think>\n\n{item.answer}", add_special_tokens=False)
        assert not has_loop(ids), item.uid


def test_copy_stats_command_prints_a_table_per_family() -> None:
    from typer.testing import CliRunner

    from selfspec_research.thinker.cli import thinker_app

    runner = CliRunner()
    args = ["copy-stats", "--data-version", "thinker-data-v3,thinker-data-v4", "--items", "3"]
    result = runner.invoke(thinker_app, [*args, "--families", "route_finding,arithmetic_search"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| thinker-data-")]
    assert [row.split(" | ")[:2] for row in rows] == [
        [f"| {version}", family]
        for version in ("thinker-data-v3", "thinker-data-v4")
        for family in ("route_finding", "arithmetic_search")
    ]
    unknown = runner.invoke(thinker_app, ["copy-stats", "--data-version", "thinker-data-v9"])
    assert unknown.exit_code == 2 and "unknown data versions" in unknown.output
