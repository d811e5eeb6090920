"""Thinker training and eval at toy scale: tiny random models, tiny task knobs, CPU.

What must hold whatever the scale: the tokenization uses the engine's boundaries,
batches cover the data deterministically, a CLI training run writes an adapter that
the registry finds by name and merges exactly, and the eval's measures (common
prefix, suffix-predictable tokens, loop detector) count what they claim.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from selfspec.models import load_model, registry
from selfspec.thinking.format import ThinkingFormat, build_prompt_text
from selfspec.testing.tiny import save_tiny_model_dir, tiny_model, tiny_tokenizer
from selfspec_research.thinker.cli import thinker_app
from selfspec_research.thinker.evaluate import (
    EvalConfig,
    _convergence,
    _Run,
    check_targets,
    common_prefix_len,
    convergence_table,
    distinct_ngram_ratio,
    has_loop,
    longest_periodic_span,
    run_eval,
    strip_answer,
    suffix_predicted_tokens,
    template_control,
    write_outputs,
)
from selfspec_research.thinker.tasks import format_training_text
from selfspec_research.thinker.train import (
    IGNORE_INDEX,
    DataSpec,
    LoraSpec,
    TrainConfig,
    collate,
    encode_example,
    fit_steps,
    lr_at,
    plan_batches,
    train_thinker,
)

TOY_KNOBS = {
    "class_synthesis": {"min_methods": 1, "max_methods": 1, "min_answer_tokens": 1},
    "record_extraction": {"min_records": 1, "max_records": 2, "min_columns": 2, "max_columns": 2, "min_answer_tokens": 1},
    "route_finding": {"min_hops": 2, "max_hops": 2, "min_answer_tokens": 1},
    "arithmetic_search": {
        "min_puzzles": 1,
        "max_puzzles": 1,
        "min_numbers": 3,
        "max_numbers": 3,
        "min_steps": 2,
        "max_steps": 2,
        "min_answer_tokens": 1,
    },
}
TOY_FAMILIES = ("route_finding", "arithmetic_search")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "base", "llama")


def _toy_data(n: int = 2, seed: int = 0) -> DataSpec:
    return DataSpec(families=TOY_FAMILIES, seed=seed, items_per_family=n, knobs=TOY_KNOBS, version="toy")


# --- data -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["prompted", "native"])
def test_example_uses_the_engines_prompt_and_close_tokens(tokenizer, kind):
    fmt = ThinkingFormat.detect(tokenizer, kind=kind)
    item = _toy_data(1).items()[0]
    example = encode_example(tokenizer, fmt, item)
    messages, target = format_training_text(item)
    prompt_text, _ = build_prompt_text(tokenizer, messages, fmt, enable_thinking=True)
    prompt_ids = list(tokenizer.encode(prompt_text, add_special_tokens=False))
    assert list(example.input_ids[: example.prompt_len]) == prompt_ids
    assert example.input_ids[-1] == tokenizer.eos_token_id
    whole = tokenizer.decode(list(example.input_ids))
    assert whole == prompt_text + (target[len("<think>\n"):] if kind == "prompted" else target) + tokenizer.eos_token
    cot_ids = tokenizer.encode(item.cot, add_special_tokens=False)
    close_at = len(example) - 1 - len(tokenizer.encode(item.answer, add_special_tokens=False)) - len(fmt.close_ids)
    assert list(example.input_ids[close_at : close_at + len(fmt.close_ids)]) == list(fmt.close_ids)
    assert list(example.input_ids[close_at - len(cot_ids) : close_at]) == cot_ids


def test_collate_labels_are_next_tokens_of_the_target_only():
    from selfspec_research.thinker.train import Example

    examples = [Example((5, 6, 7, 8, 9), 2, "f"), Example((1, 2, 3), 1, "f")]
    input_ids, labels = collate(examples, pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert labels.tolist() == [
        [IGNORE_INDEX, 7, 8, 9, IGNORE_INDEX],
        [2, 3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX],
    ]


def test_early_answer_examples_cut_the_cot_and_train_only_the_answer(tokenizer):
    """An early-answer copy is prompt + CoT[:cut] + close + the full answer + EOS, with the
    loss on the answer and EOS only (never on the cut CoT or the close marker); seeded."""
    from selfspec_research.thinker.train import early_answer_examples, encode_items

    fmt = ThinkingFormat.detect(tokenizer, kind="prompted")
    examples = encode_items(tokenizer, fmt, _toy_data(4).items())
    close = len(fmt.close_ids)
    early = early_answer_examples(examples, close, 0.5, seed=3)
    assert len(early) == round(0.5 * len([e for e in examples if e.cot_len >= 8])) > 0
    assert early == early_answer_examples(examples, close, 0.5, seed=3)
    assert early_answer_examples(examples, close, 0.0, seed=3) == []
    for e in early:
        source = next(x for x in examples if x.input_ids[: e.prompt_len + e.cot_len] == e.input_ids[: e.prompt_len + e.cot_len] and x.cot_len > e.cot_len)
        tail = source.input_ids[source.prompt_len + source.cot_len :]  # close + answer + EOS
        assert e.input_ids[e.prompt_len + e.cot_len :] == tail
        assert list(tail[:close]) == list(fmt.close_ids)
        assert e.target_start == e.prompt_len + e.cot_len + close
        _, labels = collate([e], pad_id=0)
        trained = [i for i, label in enumerate(labels[0].tolist()) if label != IGNORE_INDEX]
        assert trained[0] == e.target_start - 1 and len(trained) == len(e) - e.target_start
    with pytest.raises(ValueError, match="share"):
        early_answer_examples(examples, close, 1.5, seed=0)


def test_batches_cover_every_example_once_within_budget_and_reshuffle():
    lengths = [((i * 37) % 90) + 10 for i in range(200)]
    first = plan_batches(lengths, 400, seed=3, epoch=0)
    assert sorted(i for batch in first for i in batch) == list(range(200))
    assert all(len(batch) * max(lengths[i] for i in batch) <= 400 for batch in first)
    assert first == plan_batches(lengths, 400, seed=3, epoch=0)
    assert first != plan_batches(lengths, 400, seed=3, epoch=1)


def test_schedule_warms_up_peaks_and_decays_to_the_floor():
    assert lr_at(0, 100, 10, 1.0, 0.1) == pytest.approx(0.1)
    assert lr_at(9, 100, 10, 1.0, 0.1) == pytest.approx(1.0)
    assert lr_at(10, 100, 10, 1.0, 0.1) == pytest.approx(1.0)
    assert lr_at(100, 100, 10, 1.0, 0.1) == pytest.approx(0.1)
    values = [lr_at(s, 100, 10, 1.0, 0.1) for s in range(10, 101)]
    assert all(b <= a for a, b in zip(values, values[1:]))


def test_fit_steps_takes_the_leading_steps_that_fit():
    assert fit_steps([100, 100, 100, 100], tokens_per_s=100.0, seconds=2.5) == 2
    assert fit_steps([100, 100], tokens_per_s=100.0, seconds=10.0) == 2
    assert fit_steps([100], tokens_per_s=1.0, seconds=1.0) == 1  # always at least one


# --- training ---------------------------------------------------------------------------------------


def _toy_config(**overrides) -> TrainConfig:
    settings = dict(
        base="tiny",
        data=_toy_data(2),
        heldout_items_per_family=1,
        max_len=4096,
        tokens_per_batch=8192,
        epochs=4,
        lr=1e-2,
        warmup_ratio=0.0,
        lora=LoraSpec(r=4, alpha=8),
        log_every=1,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def test_a_spent_time_budget_still_trains_one_step(tokenizer):
    """A budget gone before training starts still gives the one step the calibration plans:
    stopping before it would save an untrained adapter."""
    model = tiny_model("llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    _, result = train_thinker(_toy_config(time_budget_s=0.001), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None)
    assert result.steps == result.planned_steps == 1


def test_toy_training_lowers_the_loss_and_is_deterministic(tokenizer):
    def run():
        model = tiny_model("llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return train_thinker(_toy_config(), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None)

    peft_a, result_a = run()
    peft_b, _ = run()
    losses = [entry["loss"] for entry in result_a.loss_log]
    assert result_a.steps == result_a.planned_steps == len(losses) > 2
    assert losses[-1] < losses[0]
    state_a = {k: v for k, v in peft_a.state_dict().items() if "lora" in k}
    state_b = {k: v for k, v in peft_b.state_dict().items() if "lora" in k}
    assert state_a and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert any(v.abs().sum() > 0 for k, v in state_a.items() if "lora_B" in k)  # B starts at zero


@pytest.fixture(scope="module")
def cli_adapter(tiny_dir, tmp_path_factory):
    """A toy adapter written by `selfspec thinker train` (the CLI, end to end)."""
    out = tmp_path_factory.mktemp("adapters") / "toy-thinker"
    result = CliRunner().invoke(
        thinker_app,
        [
            "train", "--out", str(out), "--base", str(tiny_dir), "--families", ",".join(TOY_FAMILIES),
            "--items-per-family", "2", "--knobs", json.dumps(TOY_KNOBS), "--data-version", "toy",
            "--epochs", "2", "--max-len", "4096", "--tokens-per-batch", "8192", "--lora-r", "4", "--lora-alpha", "8",
            "--heldout-items-per-family", "1", "--lr", "1e-2", "--device", "cpu", "--no-progress", "--time-budget-s", "600",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_cli_training_writes_a_complete_adapter(cli_adapter, tiny_dir):
    names = {f.name for f in cli_adapter.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "selfspec_adapter.json", "TRAINING.md", "loss_log.json"} <= names
    manifest = json.loads((cli_adapter / "selfspec_adapter.json").read_text())
    assert manifest["base"] == str(tiny_dir) and manifest["data_version"] == "toy"
    assert manifest["command"].startswith("selfspec thinker train --out")
    assert manifest["training"]["steps"] == manifest["training"]["planned_steps"] >= 1
    training = (cli_adapter / "TRAINING.md").read_text()
    assert manifest["command"] in training and "--max-steps" in training and "toy" in training


def test_adapter_loads_by_name_merged(cli_adapter, tiny_dir, tmp_path, monkeypatch):
    from peft import PeftModel

    root = tmp_path / "adapters"
    (root / "toy-thinker").mkdir(parents=True)
    for file in cli_adapter.iterdir():
        (root / "toy-thinker" / file.name).write_bytes(file.read_bytes())
    monkeypatch.setattr(registry, "PACKAGED_ADAPTERS_DIR", root)
    loaded = load_model("toy-thinker", cache_dir=tmp_path)
    assert loaded.name == "toy-thinker" and "LoRA adapter" in loaded.source
    assert not any("lora" in name for name, _ in loaded.model.named_parameters())
    ids = torch.tensor([[3, 50, 60, 70, 80, 90]])
    unmerged = PeftModel.from_pretrained(load_model(str(tiny_dir)).model, str(cli_adapter)).eval()
    base = load_model(str(tiny_dir)).model
    with torch.no_grad():
        merged_logits = loaded.model(ids).logits
        assert torch.allclose(merged_logits, unmerged(ids).logits, atol=1e-4)
        assert not torch.allclose(merged_logits, base(ids).logits, atol=1e-3)


# --- eval measures ----------------------------------------------------------------------------------


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


# --- eval pipeline ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llm(tokenizer):
    from selfspec.engine.llm_engine import EngineConfig
    from selfspec.llm import LLM

    model = tiny_model("llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LLM.from_model(model, tokenizer, engine_config=EngineConfig(num_slots=8, max_len=4096), name="tiny")


def test_eval_pipeline_runs_end_to_end(tiny_llm, tmp_path):
    config = EvalConfig(data=_toy_data(1, seed=1000), cot_cap=12, answer_cap=6, draft_cap=4)
    results = run_eval(tiny_llm, config, progress=False, log=lambda _: None)
    assert results["overall"]["items"] == 2 and set(results["families"]) == set(TOY_FAMILIES)
    for record in results["records"]:
        # a random model never stops by itself under these caps: each run counts as a loop
        assert record["thinking_closed_by"] == "cap" and record["loop"] and not record["self_stopped"]
    assert results["overall"]["reference_loops"] == 0
    paths = write_outputs(results, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| route_finding | 1 |" in report and "no (2)" in report
    assert json.loads((tmp_path / "results.json").read_text())["checks"] == check_targets(results)
    assert len(paths) == 2  # no convergence rows: no PNG


def test_convergence_forks_drafts_from_the_cot(tiny_llm, tmp_path):
    fmt, tokenizer = tiny_llm.thinking_format, tiny_llm.tokenizer
    item = _toy_data(1, seed=1000).items()[0]
    prompt_ids = tiny_llm.encode_prompt(format_training_text(item)[0], thinking=True)
    cot = tokenizer.encode(item.cot, add_special_tokens=False)[:40]
    answer = tokenizer.encode(item.answer, add_special_tokens=False)[:12]
    output = list(fmt.start_ids) + cot + list(fmt.close_ids) + answer
    record = {"self_stopped": True, "family": item.family, "uid": item.uid}
    run = _Run(item, prompt_ids, output, len(fmt.start_ids), len(cot), answer, record)
    config = EvalConfig(data=_toy_data(1, seed=1000), draft_cap=5, fork_points=(0.0, 0.25, 0.5))
    rows = _convergence(tiny_llm, [run], config, tiny_llm.engine.eos_token_ids, progress=False)
    assert [(r["point"], r["cot_tokens_seen"]) for r in rows] == [(0.0, 0), (0.25, 10), (0.5, 20)]
    for row in rows:
        assert 0 <= row["common_prefix"] <= row["predicted_tokens"] <= row["final_tokens"] == len(answer)
        assert row["predictable_share_capped"] <= row["predictable_share"]
        assert row["draft_tokens"] <= 5
    table = convergence_table(rows, config.fork_points, cap=5)
    assert table["items"] == 1 and table["overall"]["0.25"]["drafts"] == 1
    assert table["overall"]["0.50"]["drafts_at_cap"] == int(rows[2]["draft_tokens"] >= 5)


def test_template_control_pairs_answers_of_the_same_family(tokenizer):
    fmt = ThinkingFormat.detect(tokenizer)
    items = _toy_data(2, seed=1000).items()
    control = template_control(tokenizer, fmt, items)
    assert control["overall"]["pairs"] == 4 and set(control["families"]) == set(TOY_FAMILIES)
    for family in control["families"].values():
        assert family["pairs"] == 2 and 0.0 <= family["prefix_share"] <= family["predictable_share"] < 1.0


# --- the packaged adapter ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,data_version", [("smollm2-thinker", "thinker-data-v1"), ("smollm2-thinker-v4b", "thinker-data-v3")])
def test_packaged_thinker_adapter_is_complete_and_small(name, data_version):
    directory = registry.PACKAGED_ADAPTERS_DIR / name
    assert directory.is_dir(), f"selfspec/adapters/{name} is missing"
    entry = registry.get_model_entry(name)
    assert entry is not None and entry.base == "smollm2" and entry.adapter_dir == directory
    assert "<|im_start|>" in entry.end_of_turn_tokens
    size = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
    assert size <= 20_000_000
    manifest = json.loads((directory / "selfspec_adapter.json").read_text())
    assert manifest["data_version"] == data_version and manifest["command"].startswith("selfspec thinker train")
    assert f"--out selfspec/adapters/{name} " in manifest["command"]
    assert (directory / "TRAINING.md").is_file() and (directory / "adapter_config.json").is_file()
    assert registry.adapter_data_version(name) == data_version  # evals default to the adapter's items


@pytest.mark.parametrize("name", ["smollm2-thinker-v2", "smollm2-thinker-v3"])
def test_retired_adapter_name_says_how_to_restore_it(name):
    from selfspec.models.loader import load_model
    from selfspec.models.registry import ModelNotFoundError

    assert registry.get_model_entry(name) is None
    with pytest.raises(ModelNotFoundError, match=f"{name} is no longer packaged.*git checkout [0-9a-f]+ -- selfspec/adapters/{name}"):
        load_model(name)


@pytest.mark.model
def test_packaged_thinker_loads_by_name_and_thinks():
    pytest.importorskip("peft")
    from selfspec.llm import LLM
    from selfspec.models import MissingModelPackageError
    from selfspec.engine.sampling import SamplingParams

    try:
        llm = LLM(model="smollm2-thinker")
    except MissingModelPackageError as error:
        pytest.skip(str(error))
    assert llm.model_name == "smollm2-thinker" and llm.thinking_format.kind == "prompted"
    item = _toy_data(1, seed=1000).items()[0]
    out = llm.generate([format_training_text(item)[0]], SamplingParams(max_tokens=6, temperature=0.0), thinking=True)[0]
    assert len(out.token_ids) == 6 and out.reasoning_text


# --- thinker-data-v2 --------------------------------------------------------------------------------

TOY_KNOBS_V2 = {
    "record_extraction": {"version": 2, "min_records": 2, "max_records": 3, "min_columns": 2, "max_columns": 2, "min_answer_tokens": 1},
    "route_finding": {"version": 2, "min_stations": 4, "max_stations": 4, "min_lines": 2, "max_lines": 2, "min_hops": 2},
}
V2_FAMILIES = ("record_extraction", "route_finding")


def test_toy_training_runs_on_v2_data(tokenizer):
    data = DataSpec(families=V2_FAMILIES, seed=0, items_per_family=2, knobs=TOY_KNOBS_V2, version="toy-v2")
    assert {item.version for item in data.items()} == {2}
    model = tiny_model("llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    _, result = train_thinker(_toy_config(data=data), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None)
    losses = [entry["loss"] for entry in result.loss_log]
    assert result.steps == result.planned_steps == len(losses) > 2 and not result.dropped
    assert losses[-1] < losses[0]
    assert result.heldout_loss_after < result.heldout_loss_before


def test_cli_picks_the_data_version():
    from typer import Exit

    from selfspec_research.thinker.cli import _data_spec
    from selfspec_research.thinker.train import DATA_VERSION, DATA_VERSIONS, DEFAULT_TASK_KNOBS

    default = _data_spec("route_finding", 0, 3, None, None)
    assert default.version == DATA_VERSION == "thinker-data-v1" and dict(default.knobs) == DEFAULT_TASK_KNOBS
    v2 = _data_spec("record_extraction,route_finding", 1000, 3, None, "thinker-data-v2")
    assert v2.version == "thinker-data-v2" and v2.knobs["route_finding"]["version"] == 2
    assert {item.version for item in v2.items()} == {2}
    same = _data_spec("route_finding", 0, 1, json.dumps(DATA_VERSIONS["thinker-data-v2"]), "thinker-data-v2")
    assert same.items() == _data_spec("route_finding", 0, 1, None, "thinker-data-v2").items()
    for knobs, version in ((None, "thinker-data-v7"), (json.dumps(TOY_KNOBS_V2), "thinker-data-v2"), (json.dumps(TOY_KNOBS_V2), None)):
        with pytest.raises(Exit):
            _data_spec("route_finding", 0, 1, knobs, version)


def test_cli_trains_on_the_built_in_v2_data(tiny_dir, tmp_path):
    out = tmp_path / "v2-thinker"
    result = CliRunner().invoke(
        thinker_app,
        [
            "train", "--out", str(out), "--base", str(tiny_dir), "--families", ",".join(V2_FAMILIES),
            "--data-version", "thinker-data-v2", "--items-per-family", "1", "--max-steps", "2", "--epochs", "2",
            "--max-len", "4096", "--tokens-per-batch", "8192", "--lora-r", "2", "--lora-alpha", "4",
            "--heldout-items-per-family", "1", "--device", "cpu", "--no-progress", "--early-answer-share", "0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "selfspec_adapter.json").read_text())
    assert manifest["data_version"] == "thinker-data-v2" and "--data-version thinker-data-v2" in manifest["command"]
    assert manifest["train_config"]["early_answer_share"] == 0.5 and "early-answer" in result.output
    knobs = manifest["train_config"]["data"]["knobs"]
    assert knobs["record_extraction"]["version"] == knobs["route_finding"]["version"] == 2
    assert manifest["training"]["steps"] == 2 and not manifest["training"]["dropped"]
    assert '"version": 2' in (out / "TRAINING.md").read_text()


def test_eval_pipeline_runs_on_v2_items(tiny_llm):
    data = DataSpec(families=V2_FAMILIES, seed=1000, items_per_family=1, knobs=TOY_KNOBS_V2, version="toy-v2")
    results = run_eval(tiny_llm, EvalConfig(data=data, cot_cap=8, answer_cap=4, draft_cap=4), progress=False, log=lambda _: None)
    assert results["overall"]["items"] == 2 and set(results["families"]) == set(V2_FAMILIES)
    assert [record["uid"] for record in results["records"]] == [item.uid for item in data.items()]
    assert all("-v2-" in record["uid"] and not record["passed"] for record in results["records"])
    assert results["overall"]["reference_loops"] == 0 and results["config"]["data"]["version"] == "toy-v2"


def test_adapter_data_version_is_none_for_plain_models():
    assert registry.adapter_data_version("smollm2") is None
    assert registry.adapter_data_version("no-such-model") is None


def test_curve_checks_with_and_without_the_prompt_only_point():
    """v3's shape on the H200: 0% (prompt only) 82.0% > 10% 81.1%, then rising: the full curve
    does not rise, the issue's fork points (10-90%) do; a dip among the forks fails both."""
    def results(shares):
        points = ["0.00", "0.10", "0.25", "0.50", "0.75", "0.90"]
        table = {p: {"predictable_share": s, "predictable_share_capped": s} for p, s in zip(points, shares)}
        return {"families": {"f": {"accuracy": 1.0}}, "overall": {"self_stopped": 1.0, "loops": 0},
                "convergence": {"overall": table}}

    checks = check_targets(results([0.820, 0.811, 0.854, 0.862, 0.905, 0.953]))
    assert not checks["curve_rises"] and checks["curve_rises_after_forking"] and checks["predictable_at_half_ok"]
    dip = check_targets(results([0.5, 0.6, 0.7, 0.65, 0.8, 0.9]))
    assert not dip["curve_rises"] and not dip["curve_rises_after_forking"]


def test_convergence_plot_names_a_device_run_by_its_adapter(tmp_path, monkeypatch):
    """The committed v4b eval ran from /tmp/out/...; the plot's title names the adapter, not the path."""
    import matplotlib.figure

    from selfspec_research.thinker.evaluate import plot_convergence

    results = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/thinker_v4/results.json").read_text())
    assert results["model"].startswith("/tmp/out/")
    titles = []
    original = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda self, t, **kw: titles.append(t) or original(self, t, **kw))
    path = plot_convergence(results, tmp_path / "c.png")
    assert path.read_bytes().startswith(b"\x89PNG") and titles == ["Convergence of drafts with the final answer: smollm2-thinker-v4b"]


@pytest.mark.parametrize("command", [["train", "--base"], ["eval", "--model"]])
def test_a_wrong_model_is_one_line_and_exit_2(tmp_path: Path, command: list[str]):
    args = [*command, str(tmp_path / "no-model"), "--out" if command[0] == "train" else "--out-dir", str(tmp_path / "out"),
            "--items-per-family", "1", "--no-progress"]
    result = CliRunner().invoke(thinker_app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "does not exist" in " ".join(result.output.split()) and "Traceback" not in result.output
