"""Thinker training at toy scale: tiny random models, tiny task knobs, CPU.

What must hold whatever the scale: the tokenization uses the engine's boundaries,
batches cover the data deterministically, the schedule and the time budget behave as
documented, and a CLI training run writes an adapter that the registry finds by name
and merges exactly. The toy data and the tokenizer are `conftest.py`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from selfspec import LLM, SamplingParams
from selfspec.models import MissingModelPackageError, load_model, registry
from selfspec.testing.tiny import save_tiny_model_dir, tiny_model
from selfspec.thinking.format import ThinkingFormat, build_prompt_text
from selfspec_research.lora_training import LoraSpec, OptimizerSettings, fit_steps, make_schedule, token_budget_batches
from selfspec_research.thinker.cli import _data_spec, thinker_app
from selfspec_research.thinker.data_versions import DATA_VERSION, DATA_VERSIONS, DEFAULT_TASK_KNOBS
from selfspec_research.thinker.examples import (
    IGNORE_INDEX,
    Example,
    collate,
    early_answer_examples,
    encode_example,
    encode_items,
    plan_batches,
)
from selfspec_research.thinker.tasks import format_training_text
from selfspec_research.thinker.train import TrainConfig, train_thinker


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "base", "llama")


@pytest.mark.parametrize("kind", ["prompted", "native"])
def test_example_uses_the_engines_prompt_and_close_tokens(tokenizer, kind, toy):
    fmt = ThinkingFormat.detect(tokenizer, kind=kind)
    item = toy.data(1).items()[0]
    example = encode_example(tokenizer, fmt, item)
    messages, target = format_training_text(item)
    prompt_text, _ = build_prompt_text(tokenizer, messages, fmt, enable_thinking=True)
    prompt_ids = list(tokenizer.encode(prompt_text, add_special_tokens=False))
    assert list(example.input_ids[: example.prompt_len]) == prompt_ids
    assert example.input_ids[-1] == tokenizer.eos_token_id
    whole = tokenizer.decode(list(example.input_ids))
    assert whole == prompt_text + (target[len("<think>\n") :] if kind == "prompted" else target) + tokenizer.eos_token
    cot_ids = tokenizer.encode(item.cot, add_special_tokens=False)
    close_at = len(example) - 1 - len(tokenizer.encode(item.answer, add_special_tokens=False)) - len(fmt.close_ids)
    assert list(example.input_ids[close_at : close_at + len(fmt.close_ids)]) == list(fmt.close_ids)
    assert list(example.input_ids[close_at - len(cot_ids) : close_at]) == cot_ids


def test_collate_labels_are_next_tokens_of_the_target_only():
    examples = [Example((5, 6, 7, 8, 9), 2, "f"), Example((1, 2, 3), 1, "f")]
    input_ids, labels = collate(examples, pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert labels.tolist() == [
        [IGNORE_INDEX, 7, 8, 9, IGNORE_INDEX],
        [2, 3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX],
    ]


def test_early_answer_examples_cut_the_cot_and_train_only_the_answer(tokenizer, toy):
    """An early-answer copy is prompt + CoT[:cut] + close + the full answer + EOS, with the
    loss on the answer and EOS only (never on the cut CoT or the close marker); seeded."""
    fmt = ThinkingFormat.detect(tokenizer, kind="prompted")
    examples = encode_items(tokenizer, fmt, toy.data(4).items())
    close = len(fmt.close_ids)
    early = early_answer_examples(examples, close, 0.5, seed=3)
    assert len(early) == round(0.5 * len([e for e in examples if e.cot_len >= 8])) > 0
    assert early == early_answer_examples(examples, close, 0.5, seed=3)
    assert early_answer_examples(examples, close, 0.0, seed=3) == []
    for e in early:
        source = next(
            x
            for x in examples
            if x.input_ids[: e.prompt_len + e.cot_len] == e.input_ids[: e.prompt_len + e.cot_len]
            and x.cot_len > e.cot_len
        )
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


def _rates(settings: OptimizerSettings, steps: int) -> list[float]:
    """The learning rate of every step of a `steps`-step run (and one past its end)."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=settings.lr)
    schedule = make_schedule(optimizer, settings, steps)
    rates = []
    for _ in range(steps + 1):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return rates


def test_schedule_warms_up_peaks_and_decays_to_the_floor():
    rates = _rates(OptimizerSettings(lr=1.0, warmup_ratio=0.1, min_lr_ratio=0.1), 100)
    assert rates[0] == 0.0 and rates[5] == pytest.approx(0.5)  # linear warm-up over round(0.1 * 100) steps
    assert rates[10] == pytest.approx(1.0)  # the peak, where the cosine starts
    assert rates[100] == pytest.approx(0.1)  # the floor at the planned end
    assert all(b <= a for a, b in zip(rates[10:], rates[11:]))
    assert all(b >= a for a, b in zip(rates[:10], rates[1:11]))


def test_schedule_without_warm_up_starts_at_the_peak_and_a_floor_of_one_is_constant():
    rates = _rates(OptimizerSettings(lr=2e-3, min_lr_ratio=0.1), 8)
    assert rates[0] == 2e-3 and rates[4] == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5))
    assert _rates(OptimizerSettings(lr=3e-3), 5) == [3e-3] * 6  # the arbitrator's SFT: exactly constant


def test_fit_steps_takes_the_leading_steps_that_fit():
    assert fit_steps([100, 100, 100, 100], cost_per_s=100.0, seconds=2.5) == 2
    assert fit_steps([100, 100], cost_per_s=100.0, seconds=10.0) == 2
    assert fit_steps([100], cost_per_s=1.0, seconds=1.0) == 1  # always at least one
    assert fit_steps([100, 100], cost_per_s=100.0, seconds=-5.0) == 1  # a budget already spent


def test_token_budget_batches_pack_ascending_rows_up_to_the_budget():
    lengths = [3, 5, 5, 9, 20]
    assert token_budget_batches([0, 1, 2, 3, 4], lengths, 16) == [[0, 1, 2], [3], [4]]  # 20 > 16: a batch of its own
    assert token_budget_batches([0, 1, 2, 3, 4], lengths, 100) == [[0, 1, 2, 3, 4]]


def _toy_config(toy, **overrides) -> TrainConfig:
    settings = dict(
        base="tiny",
        data=toy.data(2),
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


def test_a_spent_time_budget_still_trains_one_step(tokenizer, toy):
    """A budget gone before training starts still gives the one step the calibration plans:
    stopping before it would save an untrained adapter."""
    model = tiny_model(
        "llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    _, result = train_thinker(
        _toy_config(toy, time_budget_s=0.001), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None
    )
    assert result.steps == result.planned_steps == 1


def test_toy_training_lowers_the_loss_and_is_deterministic(tokenizer, toy):
    def run():
        model = tiny_model(
            "llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        return train_thinker(_toy_config(toy), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None)

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
def cli_adapter(tiny_dir, tmp_path_factory, toy):
    """A toy adapter written by `selfspec thinker train` (the CLI, end to end)."""
    out = tmp_path_factory.mktemp("adapters") / "toy-thinker"
    result = CliRunner().invoke(
        thinker_app,
        [
            "train",
            "--out",
            str(out),
            "--base",
            str(tiny_dir),
            "--families",
            ",".join(toy.families),
            "--items-per-family",
            "2",
            "--knobs",
            json.dumps(toy.knobs),
            "--data-version",
            "toy",
            "--epochs",
            "2",
            "--max-len",
            "4096",
            "--tokens-per-batch",
            "8192",
            "--lora-r",
            "4",
            "--lora-alpha",
            "8",
            "--heldout-items-per-family",
            "1",
            "--lr",
            "1e-2",
            "--device",
            "cpu",
            "--no-progress",
            "--time-budget-s",
            "600",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_cli_training_writes_a_complete_adapter(cli_adapter, tiny_dir):
    names = {f.name for f in cli_adapter.iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "selfspec_adapter.json",
        "TRAINING.md",
        "loss_log.json",
    } <= names
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


@pytest.mark.parametrize(
    "name,data_version",
    [
        ("smollm2-thinker", "thinker-data-v1"),
        ("smollm2-thinker-v4b", "thinker-data-v3"),
        ("smollm2-thinker-v5", "thinker-data-v4"),
    ],
)
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


@pytest.mark.model
def test_packaged_thinker_loads_by_name_and_thinks(toy):
    pytest.importorskip("peft")
    try:
        llm = LLM(model="smollm2-thinker")
    except MissingModelPackageError as error:
        pytest.skip(str(error))
    assert llm.model_name == "smollm2-thinker" and llm.thinking_format.kind == "prompted"
    item = toy.data(1, seed=1000).items()[0]
    out = llm.generate([format_training_text(item)[0]], SamplingParams(max_tokens=6, temperature=0.0), thinking=True)[0]
    assert len(out.token_ids) == 6 and out.reasoning_text


def test_toy_training_runs_on_v2_data(tokenizer, toy):
    data = toy.data_v2(2, seed=0)
    assert {item.version for item in data.items()} == {2}
    model = tiny_model(
        "llama", len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    _, result = train_thinker(
        _toy_config(toy, data=data), model=model, tokenizer=tokenizer, progress=False, log=lambda _: None
    )
    losses = [entry["loss"] for entry in result.loss_log]
    assert result.steps == result.planned_steps == len(losses) > 2 and not result.dropped
    assert losses[-1] < losses[0]
    assert result.heldout_loss_after < result.heldout_loss_before


def test_cli_picks_the_data_version(toy):
    from typer import Exit

    default = _data_spec("route_finding", 0, 3, None, None)
    assert default.version == DATA_VERSION == "thinker-data-v1" and dict(default.knobs) == DEFAULT_TASK_KNOBS
    v2 = _data_spec("record_extraction,route_finding", 1000, 3, None, "thinker-data-v2")
    assert v2.version == "thinker-data-v2" and v2.knobs["route_finding"]["version"] == 2
    assert {item.version for item in v2.items()} == {2}
    same = _data_spec("route_finding", 0, 1, json.dumps(DATA_VERSIONS["thinker-data-v2"]), "thinker-data-v2")
    assert same.items() == _data_spec("route_finding", 0, 1, None, "thinker-data-v2").items()
    for knobs, version in (
        (None, "thinker-data-v7"),
        (json.dumps(toy.knobs_v2), "thinker-data-v2"),
        (json.dumps(toy.knobs_v2), None),
    ):
        with pytest.raises(Exit):
            _data_spec("route_finding", 0, 1, knobs, version)


def test_cli_trains_on_the_built_in_v2_data(tiny_dir, tmp_path, toy):
    out = tmp_path / "v2-thinker"
    result = CliRunner().invoke(
        thinker_app,
        [
            "train",
            "--out",
            str(out),
            "--base",
            str(tiny_dir),
            "--families",
            ",".join(toy.families_v2),
            "--data-version",
            "thinker-data-v2",
            "--items-per-family",
            "1",
            "--max-steps",
            "2",
            "--epochs",
            "2",
            "--max-len",
            "4096",
            "--tokens-per-batch",
            "8192",
            "--lora-r",
            "2",
            "--lora-alpha",
            "4",
            "--heldout-items-per-family",
            "1",
            "--device",
            "cpu",
            "--no-progress",
            "--early-answer-share",
            "0.5",
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


def test_adapter_data_version_is_none_for_plain_models():
    assert registry.adapter_data_version("smollm2") is None
    assert registry.adapter_data_version("no-such-model") is None


@pytest.mark.parametrize("command", [["train", "--base"], ["eval", "--model"]])
def test_a_wrong_model_is_one_line_and_exit_2(tmp_path: Path, command: list[str]):
    args = [
        *command,
        str(tmp_path / "no-model"),
        "--out" if command[0] == "train" else "--out-dir",
        str(tmp_path / "out"),
        "--items-per-family",
        "1",
        "--no-progress",
    ]
    result = CliRunner().invoke(thinker_app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "does not exist" in " ".join(result.output.split()) and "Traceback" not in result.output
