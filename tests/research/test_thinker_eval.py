"""The thinker eval at toy scale: a tiny random model, tiny task knobs, CPU.

What must hold whatever the scale: the eval's measures (common prefix, suffix-predictable
tokens, loop detector) count what they claim, the pipeline runs end to end and writes its
files, and the acceptance checks read the curve as documented. The toy data and the
tokenizer are `conftest.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from selfspec import LLM, EngineConfig
from selfspec.testing.tiny import tiny_model
from selfspec.thinking.format import ThinkingFormat
from selfspec_bench.degeneration import distinct_ngram_ratio
from selfspec_research.thinker.eval_report import check_targets, plot_convergence, write_outputs
from selfspec_research.thinker.evaluate import EvalConfig, _convergence, _Run, run_eval
from selfspec_research.thinker.measures import (
    common_prefix_len,
    convergence_table,
    has_loop,
    longest_periodic_span,
    strip_answer,
    suffix_predicted_tokens,
    template_control,
)
from selfspec_research.thinker.tasks import format_training_text


def test_common_prefix_and_suffix_predicted_tokens():
    final = list(range(10, 30))
    assert common_prefix_len(final, final[:7] + [0]) == 7
    assert suffix_predicted_tokens(final, final, anchor=[1, 2]) == len(final)
    assert suffix_predicted_tokens(final, [], anchor=[1, 2]) == 0
    draft = list(final)
    draft[5] = 99
    # 5 tokens of prefix; 15 is then the model's own token; "15" is not in the draft, so
    # 16 is the model's too; from "16" on the draft predicts 17..29 (13 tokens).
    assert suffix_predicted_tokens(final, draft, anchor=[1, 2]) == 5 + 13


def test_loop_detector_flags_repeated_blocks_only():
    block = [7, 8, 9, 10, 11, 12, 13, 14]
    looping = list(range(100, 160)) + block * 10
    period, span = longest_periodic_span(looping)
    assert period == len(block) and span == len(block) * 10 and has_loop(looping)
    assert not has_loop(list(range(500)))
    assert not has_loop(list(range(100)) + block * 2)  # two copies are not a loop
    assert distinct_ngram_ratio(block * 10) < distinct_ngram_ratio(list(range(80))) == 1.0


def test_strip_answer_drops_leading_whitespace_and_eos(tokenizer):
    ids = tokenizer.encode("\n\nFrom A take B", add_special_tokens=False) + [tokenizer.eos_token_id]
    stripped = strip_answer(ids, tokenizer, frozenset({tokenizer.eos_token_id}))
    assert tokenizer.decode(stripped) == "From A take B"


@pytest.fixture(scope="module")
def tiny_llm(tokenizer):
    model = tiny_model(
        "llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return LLM.from_model(model, tokenizer, engine_config=EngineConfig(num_slots=8, max_len=4096), name="tiny")


def test_eval_pipeline_runs_end_to_end(tiny_llm, tmp_path, toy):
    config = EvalConfig(data=toy.data(1, seed=1000), cot_cap=12, answer_cap=6, draft_cap=4)
    results = run_eval(tiny_llm, config, progress=False, log=lambda _: None)
    assert results["overall"]["items"] == 2 and set(results["families"]) == set(toy.families)
    for record in results["records"]:
        # a random model never stops by itself under these caps: each run counts as a loop
        assert record["thinking_closed_by"] == "cap" and record["loop"] and not record["self_stopped"]
    assert results["overall"]["reference_loops"] == 0
    paths = write_outputs(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| route_finding | 1 |" in report and "no (2)" in report
    assert json.loads((tmp_path / "results.json").read_text())["checks"] == check_targets(results)
    assert len(paths) == 2  # no convergence rows: no PNG


def test_convergence_forks_drafts_from_the_cot(tiny_llm, tmp_path, toy):
    fmt, tokenizer = tiny_llm.thinking_format, tiny_llm.tokenizer
    item = toy.data(1, seed=1000).items()[0]
    prompt_ids = tiny_llm.encode_prompt(format_training_text(item)[0], thinking=True)
    cot = tokenizer.encode(item.cot, add_special_tokens=False)[:40]
    answer = tokenizer.encode(item.answer, add_special_tokens=False)[:12]
    output = list(fmt.start_ids) + cot + list(fmt.close_ids) + answer
    record = {"self_stopped": True, "family": item.family, "uid": item.uid}
    run = _Run(item, prompt_ids, output, len(fmt.start_ids), len(cot), answer, record)
    config = EvalConfig(data=toy.data(1, seed=1000), draft_cap=5, fork_points=(0.0, 0.25, 0.5))
    rows = _convergence(tiny_llm, [run], config, tiny_llm.engine.eos_token_ids, progress=False)
    assert [(r["point"], r["cot_tokens_seen"]) for r in rows] == [(0.0, 0), (0.25, 10), (0.5, 20)]
    for row in rows:
        assert 0 <= row["common_prefix"] <= row["predicted_tokens"] <= row["final_tokens"] == len(answer)
        assert row["predictable_share_capped"] <= row["predictable_share"]
        assert row["draft_tokens"] <= 5
    table = convergence_table(rows, config.fork_points, cap=5)
    assert table["items"] == 1 and table["overall"]["0.25"]["drafts"] == 1
    assert table["overall"]["0.50"]["drafts_at_cap"] == int(rows[2]["draft_tokens"] >= 5)


def test_template_control_pairs_answers_of_the_same_family(tokenizer, toy):
    fmt = ThinkingFormat.detect(tokenizer)
    items = toy.data(2, seed=1000).items()
    control = template_control(tokenizer, fmt, items)
    assert control["overall"]["pairs"] == 4 and set(control["families"]) == set(toy.families)
    for family in control["families"].values():
        assert family["pairs"] == 2 and 0.0 <= family["prefix_share"] <= family["predictable_share"] < 1.0


def test_eval_pipeline_runs_on_v2_items(tiny_llm, toy):
    data = toy.data_v2(1, seed=1000)
    results = run_eval(
        tiny_llm, EvalConfig(data=data, cot_cap=8, answer_cap=4, draft_cap=4), progress=False, log=lambda _: None
    )
    assert results["overall"]["items"] == 2 and set(results["families"]) == set(toy.families_v2)
    assert [record["uid"] for record in results["records"]] == [item.uid for item in data.items()]
    assert all("-v2-" in record["uid"] and not record["passed"] for record in results["records"])
    assert results["overall"]["reference_loops"] == 0 and results["config"]["data"]["version"] == "toy-v2"


def test_curve_checks_with_and_without_the_prompt_only_point():
    """A prompt-only point (0%) above the first fork (10%), then rising: the full curve does
    not rise, the fork points proper (10-90%) do; a dip among the forks fails both."""

    def results(shares):
        points = ["0.00", "0.10", "0.25", "0.50", "0.75", "0.90"]
        table = {p: {"predictable_share": s, "predictable_share_capped": s} for p, s in zip(points, shares)}
        return {
            "families": {"f": {"accuracy": 1.0}},
            "overall": {"self_stopped": 1.0, "loops": 0},
            "convergence": {"overall": table},
        }

    checks = check_targets(results([0.820, 0.811, 0.854, 0.862, 0.905, 0.953]))
    assert not checks["curve_rises"] and checks["curve_rises_after_forking"] and checks["predictable_at_half_ok"]
    dip = check_targets(results([0.5, 0.6, 0.7, 0.65, 0.8, 0.9]))
    assert not dip["curve_rises"] and not dip["curve_rises_after_forking"]


def test_convergence_plot_names_a_device_run_by_its_adapter(tmp_path, monkeypatch):
    """A results file whose model is a path (an adapter written on a device machine) gets a
    plot titled by the adapter's name, not by the path."""
    import matplotlib.figure

    results = json.loads((Path(__file__).resolve().parents[2] / CONVERGENCE_RESULTS).read_text())
    assert results["model"].startswith("/tmp/out/")
    titles = []
    original = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t) or original(self, t, **kw)
    )
    path = plot_convergence(results, tmp_path / "c.png")
    assert path.read_bytes().startswith(b"\x89PNG") and titles == [
        "Convergence of drafts with the final answer: smollm2-thinker-v4b"
    ]


CONVERGENCE_RESULTS = "benchmarks/thinker/records/h200/smollm2-thinker-v4b_convergence.json"
"""A committed `selfspec thinker eval` results file (smollm2-thinker-v4b, run from /tmp/out/...)."""
