"""thinker-data-long-v1: class synthesis version 3, whose answer is longer than its CoT (a terse
plan in varied wording, the bodies written only in the answer), beside thinker-data-v4's
other families.

What must hold: the items regenerate exactly, their prompts, answers and tests are version
1's (so the family's checker grades them unchanged and every reference passes it), the CoT
still writes the answer's class line, constructor and `def` lines in the answer's order,
and the answer is at least as long as the CoT. The thinker trains on a mix of v4 and this
version (`DATA_MIXES`): the union of their items, each family's once where the knobs agree."""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from selfspec_research.thinker.data_versions import (
    DATA_MIX_V4_LONG_V1,
    DATA_MIXES,
    DATA_VERSION_LONG_V1,
    DATA_VERSION_V4,
    DATA_VERSIONS,
    HELDOUT_SEED,
    data_version_knobs,
    data_version_parts,
)
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

LONG = DATA_VERSION_LONG_V1


def _items(version: str, family: str, seed: int, n: int) -> list[TaskItem]:
    knobs = data_version_knobs(version)[family]
    return [generate(family, seed, index, **knobs) for index in range(n)]


@pytest.fixture(scope="module")
def long_items() -> list[TaskItem]:
    """20 held-out class items of the long version."""
    return _items(LONG, "class_synthesis", HELDOUT_SEED, 20)


def _words(text: str) -> int:
    return len(text.split())


def _sha(items: list[TaskItem]) -> list[str]:
    return [hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest() for item in items]


# ------------------------------------------------------------------------ registration
def test_long_v1_is_v4_with_class_synthesis_version_3_and_more_methods() -> None:
    long, v4 = DATA_VERSIONS[LONG], DATA_VERSIONS[DATA_VERSION_V4]
    assert LONG == "thinker-data-long-v1" and set(long) == set(families())
    assert {name: knobs for name, knobs in long.items() if name != "class_synthesis"} == {
        name: knobs for name, knobs in v4.items() if name != "class_synthesis"
    }
    assert long["class_synthesis"]["version"] == 3 and long["class_synthesis"]["min_methods"] >= 7
    assert get_family("class_synthesis", version=3).stream_version == 1


def test_other_families_are_v4_items() -> None:
    for family in families():
        if family != "class_synthesis":
            assert _items(LONG, family, HELDOUT_SEED, 3) == _items(DATA_VERSION_V4, family, HELDOUT_SEED, 3)


def test_items_are_version_1_items_with_another_cot() -> None:
    """Prompt, answer and tests come from version 1's stream: the checker data are unchanged."""
    knobs = {key: value for key, value in data_version_knobs(LONG)["class_synthesis"].items() if key != "version"}
    for index in range(6):
        old = generate("class_synthesis", HELDOUT_SEED, index, **knobs)
        new = generate("class_synthesis", HELDOUT_SEED, index, **knobs, version=3)
        assert (new.prompt, new.answer, new.meta) == (old.prompt, old.answer, old.meta)
        assert new.version == 3 and new.cot != old.cot


# ------------------------------------------------------------------------ determinism
def test_items_are_deterministic_per_seed(long_items: list[TaskItem]) -> None:
    assert _items(LONG, "class_synthesis", HELDOUT_SEED, 20) == long_items
    other = _items(LONG, "class_synthesis", HELDOUT_SEED + 1, 20)
    assert all(a.cot != b.cot for a, b in zip(long_items, other))


def test_items_reproduce_in_another_process_with_another_hash_seed(long_items: list[TaskItem]) -> None:
    code = (
        "import hashlib, json\n"
        "from selfspec_research.thinker.data_versions import data_version_knobs\n"
        "from selfspec_research.thinker.tasks import generate\n"
        f"knobs = data_version_knobs({LONG!r})['class_synthesis']\n"
        "for index in range(4):\n"
        f"    item = generate('class_synthesis', {HELDOUT_SEED}, index, **knobs)\n"
        "    print(hashlib.sha256(json.dumps(item.to_dict(), sort_keys=True).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "987"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=90)
    assert out.stdout.split() == _sha(long_items[:4])


# ------------------------------------------------------------------ answers and checker
def test_checker_accepts_every_reference_answer(long_items: list[TaskItem]) -> None:
    bare = check_many(long_items, [item.answer for item in long_items])
    assert [(item.uid, r.detail) for item, r in zip(long_items, bare) if not r.passed] == []
    full = check_many(long_items, [format_training_text(item)[1] for item in long_items])  # the CoT before it
    assert all(result.passed and result.score == 1.0 for result in full)
    broken = [
        "\n    def ".join(item.answer.split("\n    def ")[:-1]) + "\n```" for item in long_items[:3]
    ]  # last one gone
    assert not any(result.passed for result in check_many(long_items[:3], broken))


# ------------------------------------------------------------------------ the CoT's shape
def test_answer_is_longer_than_the_cot(long_items: list[TaskItem]) -> None:
    """The data version's point, in words and characters (the README gives SmolLM2 tokens)."""
    word_ratios = [_words(item.answer) / _words(item.cot) for item in long_items]
    char_ratios = [len(item.answer) / len(item.cot) for item in long_items]
    assert statistics.median(word_ratios) >= 1.0, word_ratios
    assert statistics.median(char_ratios) >= 1.2, char_ratios
    assert min(char_ratios) >= 1.0, char_ratios
    v4 = _items(DATA_VERSION_V4, "class_synthesis", HELDOUT_SEED, 20)
    assert statistics.median(len(item.answer) / len(item.cot) for item in v4) < 0.8  # v4's CoT is the longer


def test_cot_writes_the_class_line_constructor_and_def_lines_in_order(long_items: list[TaskItem]) -> None:
    for item in long_items:
        lines = [line for line in item.answer.splitlines() if not line.startswith("```")]
        defs = [line for line in lines if line.lstrip().startswith("def ")]
        assert len(defs) == len(item.meta["methods"]) + 1, item.uid
        assert ordered_line_coverage("\n".join(defs), item.cot) == 1.0, item.uid
        init_end = lines.index(defs[1])  # class line, docstring, constructor
        assert ordered_line_coverage("\n".join(lines[:init_end]), item.cot) == 1.0, item.uid
        bodies = [line for line in lines[init_end:] if line.strip() and line not in defs]
        written = {line.strip() for line in item.cot.splitlines()}
        assert not [line for line in bodies if line.strip() in written and len(line.strip()) > 12], item.uid


def test_cot_plans_each_method_in_one_line_below_its_def_line(long_items: list[TaskItem]) -> None:
    for item in long_items:
        lines = item.cot.splitlines()
        for name in item.meta["methods"]:
            at = next(k for k, line in enumerate(lines) if line.strip().startswith(f"def {name}("))
            plan = lines[at + 1]
            assert plan and not plan.startswith(" ") and plan.endswith((".", "!", "?")), (item.uid, plan)


def test_cot_wording_varies(long_items: list[TaskItem]) -> None:
    """The same step is said several ways: the intro, and the lead of a method's plan line."""

    def masked(text: str) -> str:
        return re.sub(r"\d+", "#", re.sub(r"`[^`]*`", "`_`", text))

    intros = {masked(item.cot.split("\n", 1)[0]) for item in long_items}
    leads = set()
    for item in long_items:
        lines = item.cot.splitlines()
        leads |= {lines[k + 1].split(" ")[0] for k, line in enumerate(lines[:-1]) if line.startswith("    def ")}
    assert len(intros) >= 3 and len(leads) >= 5, (intros, leads)


def test_smollm2_tokens_meet_the_target_over_50_held_out_items() -> None:
    """The brief's own measure when SmolLM2's tokenizer is in the model cache: median answer /
    CoT >= 1.0 and prompt + CoT + answer mostly (90%) under 3.5k tokens."""
    from selfspec_research.thinker.lengths import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    if tokenizer is None:
        pytest.skip("SmolLM2's tokenizer is not in the model cache")
    items = _items(LONG, "class_synthesis", HELDOUT_SEED, 50)

    def count(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]

    prompts, cots, answers = (count([getattr(item, part) for item in items]) for part in ("prompt", "cot", "answer"))
    assert statistics.median(a / c for a, c in zip(answers, cots)) >= 1.0
    totals = [p + c + a for p, c, a in zip(prompts, cots, answers)]
    assert sum(total <= 3500 for total in totals) >= 45, sorted(totals)[-6:]


# ------------------------------------------------------------------ the training mix
def test_the_mix_is_v4_plus_the_long_class_items() -> None:
    spec = DataSpec.for_version(DATA_MIX_V4_LONG_V1, seed=3, items_per_family=2)
    assert DATA_MIXES[DATA_MIX_V4_LONG_V1] == (DATA_VERSION_V4, LONG)
    v4 = DataSpec.for_version(DATA_VERSION_V4, seed=3, items_per_family=2).items()
    long = DataSpec.for_version(LONG, families=["class_synthesis"], seed=3, items_per_family=2).items()
    assert spec.items() == v4 + long  # families with the same knobs in both parts count once
    assert spec.describe()["also"] == [{"class_synthesis": DATA_VERSIONS[LONG]["class_synthesis"]}]
    assert "also" not in DataSpec.for_version(DATA_VERSION_V4).describe()  # plain versions as before
    assert data_version_knobs(DATA_MIX_V4_LONG_V1) == data_version_knobs(LONG)  # what benchmarks take
    assert data_version_parts(LONG) == (LONG,)


def test_cli_trains_on_the_mix_and_names_it(tmp_path: Path) -> None:
    from typer import Exit
    from typer.testing import CliRunner

    from selfspec.testing.tiny import save_tiny_model_dir
    from selfspec_research.thinker.cli import _data_spec, thinker_app

    with pytest.raises(Exit):
        _data_spec("class_synthesis", 0, 1, None, "thinker-data-mix-v9")
    tiny = save_tiny_model_dir(tmp_path / "base", "llama")
    out = tmp_path / "mix-thinker"
    args = ["train", "--out", str(out), "--base", str(tiny), "--families", "class_synthesis"]
    args += ["--data-version", DATA_MIX_V4_LONG_V1, "--items-per-family", "1", "--max-steps", "1"]
    args += ["--max-len", "16384", "--tokens-per-batch", "16384", "--lora-r", "2", "--lora-alpha", "4"]
    args += ["--heldout-items-per-family", "1", "--device", "cpu", "--no-progress"]
    result = CliRunner().invoke(thinker_app, args)
    assert result.exit_code == 0, result.output
    assert f"data {DATA_MIX_V4_LONG_V1}: 2 examples" in result.output  # one v4 class item, one long one
    manifest = json.loads((out / "selfspec_adapter.json").read_text())
    assert manifest["data_version"] == DATA_MIX_V4_LONG_V1 and not manifest["training"]["dropped"]
    assert manifest["train_config"]["data"]["also"] == [{"class_synthesis": DATA_VERSIONS[LONG]["class_synthesis"]}]
    assert "`class_synthesis` (also): `{" in (out / "TRAINING.md").read_text()
