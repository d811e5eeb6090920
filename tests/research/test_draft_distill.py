"""Distilled shallow self-draft at toy scale: tiny random models, toy task
knobs, CPU. What must hold whatever the scale: training lowers the distillation loss, the
target's weights never change (training, saving, loading, merging, fused targets), a
saved draft loads to the very logits it was trained to, and SpS with it stays exact."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

from selfspec import LLM, DraftModelConfig, EngineConfig, SamplingParams, ThinkingLimits
from selfspec.engine.fusion import compile_pointwise_modules, fused, use_skinny_gemms
from selfspec.engine.skinny_gemm import SkinnyGemmTable
from selfspec.models import MissingModelPackageError
from selfspec.models.registry import PACKAGED_DRAFTS_DIR
from selfspec.spec.distilled_draft import (
    MANIFEST,
    load_distilled_draft,
    own_layers_draft,
    parse_distilled_spec,
    read_draft_manifest,
)
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.format import ThinkingFormat
from selfspec_research.cospec.cli import cospec_app
from selfspec_research.cospec.distill_data import build_training_blocks, pack_examples, plan_blocks
from selfspec_research.cospec.distill_metrics import distill_loss
from selfspec_research.cospec.draft_distill import (
    DistillConfig,
    merged_copy,
    save_distilled_draft,
    train_distilled_draft,
)
from selfspec_research.lora_training import selected_logits
from selfspec_research.thinker.examples import Example

TOY_KNOBS = {
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
PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "hello", "def add(a, b):"]


def toy_config(**overrides) -> DistillConfig:
    values = dict(
        model="custom",
        layers=1,
        steps=6,
        batch_size=4,
        seq_len=64,
        lr=1e-2,
        rank=8,
        families=tuple(TOY_KNOBS),
        knobs=TOY_KNOBS,
        data_version="toy",
        max_items_per_family=4,
        heldout_items_per_family=2,
        heldout_max_len=512,
        device="cpu",
        dtype="auto",
        log_every=100,
    )
    values.update(overrides)
    return DistillConfig(**values)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_unchanged(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    changed = [name for name, tensor in after.items() if not torch.equal(tensor, before[name])]
    assert not changed, f"target weights changed: {changed[:5]}"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def trained(tok):
    """(target, its weights before training, peft draft, result, config)."""
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    before = snapshot(target)
    config = toy_config()
    target, peft_draft, result = train_distilled_draft(
        config, target=target, tokenizer=tok, progress=False, log=lambda m: None
    )
    return target, before, peft_draft, result, config


@pytest.fixture(scope="module")
def saved(trained, tmp_path_factory):
    target, _, peft_draft, result, config = trained
    return save_distilled_draft(
        peft_draft, tmp_path_factory.mktemp("draft") / "d", target=target, config=config, result=result, command="test"
    )


def test_pack_examples_marks_assistant_predictions():
    examples = [Example((1, 2, 3, 4, 5), 2, "a"), Example((6, 7, 8), 1, "b")]
    blocks = pack_examples(examples, 4)
    assert blocks.ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    # positions predicting assistant tokens: ex1 t=1,2,3 (-> 3,4,5); ex2 t=0,1 (-> 7,8)
    assert blocks.mask.tolist() == [[False, True, True, True], [False, True, True, False]]
    assert parse_distilled_spec("layers:3") is None
    assert parse_distilled_spec("layers:3+/x/y")[1] == 3
    assert parse_distilled_spec("distilled:/x/y")[1] is None
    with pytest.raises(ValueError):
        parse_distilled_spec("layers:a+/x")


def test_pack_examples_carries_the_reference_next_tokens():
    examples = [Example((1, 2, 3, 4, 5), 2, "a"), Example((6, 7, 8), 1, "b")]
    blocks = pack_examples(examples, 4)
    # the next token of the stream, across a block's end too (4 -> 5 lies in the next block)
    assert blocks.targets.tolist() == [[2, 3, 4, 5], [6, 7, 8, 0]]
    assert blocks.targets[blocks.mask].tolist() == [3, 4, 5, 7, 8]


def test_loss_weights_need_one_term_and_reference_alone_is_allowed():
    assert toy_config(kl_weight=0.0, reference_weight=1.0).reference_weight == 1.0
    with pytest.raises(ValueError, match="not all 0"):
        toy_config(kl_weight=0.0)
    with pytest.raises(ValueError, match="not all 0"):
        toy_config(kl_weight=-1.0, reference_weight=2.0)
    logits = torch.randn(5, 7)
    with pytest.raises(ValueError, match="reference tokens"):
        distill_loss(logits, logits, reference_weight=1.0)
    assert distill_loss(logits, logits)[1]["ref"] != distill_loss(logits, logits)[1]["ref"]  # NaN: not measured


def test_reference_loss_alone_learns_the_training_tokens_not_the_target(tok, tmp_path):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    before = snapshot(target)
    config = toy_config(kl_weight=0.0, reference_weight=1.0, data_seed=7)
    target, peft_draft, result = train_distilled_draft(
        config, target=target, tokenizer=tok, progress=False, log=lambda m: None
    )
    assert_unchanged(target, before)
    assert {"ref", "kl", "ce"} <= set(result.loss_log[0])
    # reference CE on the training blocks of the first steps: adapter off (initial draft) vs trained
    blocks, _ = build_training_blocks(config, tok, ThinkingFormat.detect(tok), config.steps * config.batch_size)
    plan = plan_blocks(len(blocks), config.batch_size, config.steps, config.seed)
    used = sorted({i for step in plan for i in step})
    ids, mask = blocks.ids[used], blocks.mask[used]
    reference = blocks.targets[used][mask]
    with torch.no_grad():
        teacher = selected_logits(target, ids, mask)
        with peft_draft.disable_adapter():
            ref_before = distill_loss(teacher, selected_logits(peft_draft, ids, mask), reference=reference)[1]["ref"]
        ref_after = distill_loss(teacher, selected_logits(peft_draft, ids, mask), reference=reference)[1]["ref"]
    assert ref_after < 0.9 * ref_before, (ref_before, ref_after)
    # loss = the reference CE alone: the first step's logged loss is its ref term
    assert result.loss_log[0]["loss"] == pytest.approx(result.loss_log[0]["ref"], rel=1e-6)
    distilled = result.heldout_distilled["all"]
    assert distilled["reference_accuracy"] is not None and distilled["reference_ce"] is not None
    path = save_distilled_draft(peft_draft, tmp_path / "d", target=target, config=config, result=result)
    manifest = read_draft_manifest(path)
    assert manifest["loss"]["kl_weight"] == 0.0 and manifest["loss"]["reference_weight"] == 1.0
    assert manifest["data"]["seed"] == 7 and manifest["config"]["data_seed"] == 7


def test_own_layers_draft_copies_layers_and_shares_the_rest(tok):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3)
    draft = own_layers_draft(target, 2)
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert (
        draft.model.layers[0].self_attn.q_proj.weight.data_ptr()
        != target.model.layers[0].self_attn.q_proj.weight.data_ptr()
    )
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        hidden = target.model(ids, output_hidden_states=True).hidden_states[2]
        expected = target.lm_head(target.model.norm(hidden))
        torch.testing.assert_close(draft(ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_toy_distillation_lowers_kl_and_leaves_the_target_alone(trained):
    target, before, peft_draft, result, config = trained
    assert result.steps == config.steps and len(result.loss_log) == config.steps
    assert set(result.loss_log[0]) >= {"step", "loss", "kl", "ce", "agree", "lr"}
    assert_unchanged(target, before)
    # KL on the first step's own batch: adapter off (= the initial draft, LoRA B = 0) vs trained.
    tok = tiny_tokenizer()
    blocks, _ = build_training_blocks(config, tok, ThinkingFormat.detect(tok), config.steps * config.batch_size)
    first = plan_blocks(len(blocks), config.batch_size, config.steps, config.seed)[0]
    ids, mask = blocks.ids[first], blocks.mask[first]
    with torch.no_grad():
        teacher = selected_logits(target, ids, mask)
        with peft_draft.disable_adapter():
            kl_before = distill_loss(teacher, selected_logits(peft_draft, ids, mask))[1]["kl"]
        kl_after = distill_loss(teacher, selected_logits(peft_draft, ids, mask))[1]["kl"]
    assert kl_after < 0.9 * kl_before, (kl_before, kl_after)
    assert result.loss_log[0]["kl"] == pytest.approx(kl_before, rel=1e-4)
    # held-out metrics exist for both drafts, and the distilled one is closer to the target
    plain, distilled = result.heldout_plain["all"], result.heldout_distilled["all"]
    assert plain["positions"] == distilled["positions"] > 0
    assert distilled["kl"] < plain["kl"]


def test_runs_are_deterministic_and_accumulate_gradients(tok):
    def run(**overrides):
        target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
        config = toy_config(steps=3, heldout_items_per_family=1, **overrides)
        _, draft, result = train_distilled_draft(
            config, target=target, tokenizer=tok, progress=False, log=lambda m: None
        )
        weights = {k: v.detach().clone() for k, v in draft.named_parameters() if v.requires_grad}
        return result, weights

    first, w1 = run()
    second, w2 = run()
    assert [e["loss"] for e in first.loss_log] == [e["loss"] for e in second.loss_log]
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    # 2 micro-batches of 2 blocks = the same 4 blocks per step: the same first-step loss
    accumulated, _ = run(batch_size=2, grad_accum=2)
    assert accumulated.loss_log[0]["kl"] == pytest.approx(first.loss_log[0]["kl"], rel=1e-4)
    assert len(accumulated.loss_log) == 3


def test_time_budget_fits_the_step_count(tok):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    lines: list[str] = []
    config = toy_config(steps=100_000, time_budget_s=3.0, heldout_items_per_family=1)
    _, _, result = train_distilled_draft(config, target=target, tokenizer=tok, progress=False, log=lines.append)
    assert any(line.startswith("calibration:") for line in lines)
    assert 1 <= result.steps <= result.planned_steps < 100_000  # at least one step, even on a loaded machine
    # Stopped near the budget, not after 100,000 steps (minutes): the bound leaves room for a busy CPU.
    assert result.seconds < 30.0


def test_a_spent_time_budget_still_trains_one_step(tok):
    """A budget gone before training starts (here: a millisecond) still gives the one step the
    calibration plans: stopping before it would save an untrained draft."""
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    config = toy_config(steps=50, time_budget_s=0.001, heldout_items_per_family=1)
    _, _, result = train_distilled_draft(config, target=target, tokenizer=tok, progress=False, log=lambda m: None)
    assert result.steps == result.planned_steps == 1 and len(result.loss_log) == 1


def test_save_load_round_trip_gives_identical_logits(trained, saved):
    target, before, peft_draft, result, config = trained
    manifest = read_draft_manifest(saved)
    assert manifest["layers"] == 1 and manifest["target_layers"] == 3 and manifest["command"] == "test"
    assert manifest["data"]["seed"] == config.data_seed and manifest["data"]["version"] == "toy"
    assert manifest["metrics"]["heldout_distilled"]["all"]["top1_agreement"] is not None
    assert (saved / "adapter_config.json").is_file() and (saved / "loss_log.json").is_file()
    loaded = load_distilled_draft(target, saved)
    again = load_distilled_draft(target, saved)
    in_memory = merged_copy(peft_draft)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27]])
    with torch.no_grad():
        a, b, c = loaded(ids).logits, again(ids).logits, in_memory(ids).logits
        unmerged = peft_draft(input_ids=ids).logits
        plain = own_layers_draft(target, 1)(ids).logits
    assert torch.equal(a, b) and torch.equal(a, c)
    torch.testing.assert_close(a, unmerged, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a, plain, atol=1e-3), "the LoRA did not take effect"
    assert_unchanged(target, before)
    # the peft draft still works (merged_copy did not merge into it)
    with torch.no_grad():
        torch.testing.assert_close(peft_draft(input_ids=ids).logits, unmerged)


def test_load_refuses_other_targets_and_layer_counts(tok, trained, saved):
    target = trained[0]
    with pytest.raises(ValueError, match="layers"):
        load_distilled_draft(target, saved, layers=2)
    other = tiny_model("qwen3", len(tok), seed=5, num_layers=3, eos_token_id=tok.eos_token_id)
    with pytest.raises(ValueError, match="other weights"):
        load_distilled_draft(other, saved)
    deeper = tiny_model("qwen3", len(tok), seed=4, num_layers=4, eos_token_id=tok.eos_token_id)
    with pytest.raises(ValueError, match="target_layers"):
        load_distilled_draft(deeper, saved)
    # a bf16 copy of the same target passes the signature check
    load_distilled_draft(copy.deepcopy(target).to(torch.bfloat16), saved)


@pytest.mark.parametrize("spelling", ["distilled:{}", "layers:1+{}", "layers:1"])
def test_sps_with_the_distilled_draft_is_token_identical(tok, trained, saved, spelling):
    target, before = trained[0], trained[1]
    llm = LLM.from_model(
        target, tok, engine_config=EngineConfig(num_slots=8, max_len=256), draft=spelling.format(saved)
    )
    assert llm.draft_spec == spelling.format(saved)
    shares_layers = llm.draft_runner.model.model.layers[0] is target.model.layers[0]
    assert shares_layers == (spelling == "layers:1")  # plain "layers:N" is unchanged: shared layers
    limits = ThinkingLimits(cot_cap=30, answer_cap=25, fixed_length=True)
    params = SamplingParams(max_tokens=100)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    out = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec=DraftModelConfig(num_speculative_tokens=4))
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
        assert o.metrics["proposed_tokens"] > 0
    assert llm.draft_runner.slots.num_used == 0
    assert_unchanged(target, before)
    with pytest.raises(ValueError, match="layers"):
        llm.set_draft(f"layers:2+{saved}")


def test_a_fused_target_gives_the_draft_its_own_weights(tok, trained, saved):
    """A copy of a layer the engine fused must not run the original's weights (the fused
    forwards are closures over the original modules), and it must copy at all: the GPU's
    skinny-GEMM pass leaves its kernel table (which holds a lock) on the attention modules."""
    target, _, _, _, _ = trained
    fused_target = copy.deepcopy(target)
    compile_pointwise_modules(fused_target, backend="aot_eager")
    assert use_skinny_gemms(fused_target, SkinnyGemmTable(), backend="aot_eager")
    with pytest.raises(TypeError, match="pickle"):
        copy.deepcopy(fused_target.model.layers)  # why `unfused_copy` exists
    before = snapshot(fused_target)
    reference = load_distilled_draft(target, saved)
    draft = load_distilled_draft(fused_target, saved, compile_backend="aot_eager")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(draft(ids).logits, expected, rtol=1e-5, atol=1e-5)
        with fused():
            torch.testing.assert_close(draft(ids).logits, expected, rtol=1e-4, atol=1e-4)
    assert_unchanged(fused_target, before)


def test_cli_train_draft_on_the_tiny_model(tmp_path, tok):
    out = tmp_path / "draft"
    args = [
        "train-draft",
        "--model",
        "tiny",
        "--layers",
        "1",
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--seq-len",
        "64",
        "--rank",
        "4",
        "--heldout-items",
        "1",
        "--families",
        "route_finding",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--no-progress",
        "--log-every",
        "1",
    ]
    result = CliRunner().invoke(cospec_app, args)
    assert result.exit_code == 0, result.output
    assert "step 3/3" in result.output and "held-out top-1 agreement" in result.output
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["base"] == "tiny" and manifest["layers"] == 1 and manifest["training"]["steps"] == 3
    assert manifest["command"].startswith("selfspec cospec train-draft --model tiny --layers 1")
    assert len(json.loads((out / "loss_log.json").read_text())) == 3
    # the `tiny` model of `selfspec.server.cli.load_llm` (qwen3, 2 layers, seed 0) takes it
    net = tiny_model("qwen3", len(tok), eos_token_id=tok.eos_token_id)
    llm = LLM.from_model(net, tok, engine_config=EngineConfig(num_slots=2, max_len=128), draft=f"distilled:{out}")
    assert llm.draft_runner is not None
    bad = CliRunner().invoke(cospec_app, args[:4] + ["2"] + args[5:])
    assert bad.exit_code == 2 and "--layers must be in [1, 1]" in bad.output


def test_cli_train_draft_on_reference_tokens_records_loss_and_data(tmp_path):
    out = tmp_path / "draft"
    args = ["train-draft", "--model", "tiny", "--layers", "1", "--steps", "1", "--batch-size", "1", "--seq-len", "64"]
    args += ["--rank", "4", "--heldout-items", "1", "--families", "arithmetic_search", "--device", "cpu"]
    args += ["--kl-weight", "0", "--reference-weight", "1", "--data-version", "thinker-data-hard-v1"]
    args += ["--data-seed", "7", "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(cospec_app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["loss"] == {"kl_weight": 0.0, "ce_weight": 0.0, "reference_weight": 1.0, "temperature": 1.0}
    assert manifest["data"]["version"] == "thinker-data-hard-v1" and manifest["data"]["seed"] == 7
    assert "--reference-weight 1.0" in manifest["command"]
    where = args.index("--reference-weight") + 1
    bad = CliRunner().invoke(cospec_app, [*args[:where], "0", *args[where + 1 :]])
    assert bad.exit_code == 2 and "not all 0" in bad.output


def test_packaged_draft_names_resolve_to_the_package():
    path, layers = parse_distilled_spec("distilled:smollm2-thinker-l8")
    assert path == PACKAGED_DRAFTS_DIR / "smollm2-thinker-l8" and layers is None
    manifest = read_draft_manifest(path)
    assert manifest["base"] == "smollm2-thinker" and manifest["layers"] == 8
    assert "--out selfspec/drafts/smollm2-thinker-l8 " in manifest["command"]
    assert sum(f.stat().st_size for f in path.iterdir()) <= 20_000_000
    assert parse_distilled_spec("distilled:no-such-draft")[0].name == "no-such-draft"  # a path, not found later


@pytest.mark.model
def test_packaged_draft_loads_under_its_target_and_sps_is_exact():
    """The shipped draft matches smollm2-thinker's weights (signature) and SpS with it is exact."""
    pytest.importorskip("peft")
    try:
        llm = LLM(
            "smollm2-thinker",
            draft="distilled:smollm2-thinker-l8",
            engine_config=EngineConfig(num_slots=4, max_len=512),
        )
    except MissingModelPackageError as error:
        pytest.skip(str(error))
    limits = ThinkingLimits(cot_cap=12, answer_cap=12, fixed_length=True)
    params = SamplingParams(max_tokens=100)
    prompt = ["Write a Python class Counter with increment and reset methods."]
    base = llm.generate(prompt, params, limits=limits, thinking=True, spec="off")
    out = llm.generate(prompt, params, limits=limits, thinking=True, spec=DraftModelConfig(num_speculative_tokens=4))
    assert out[0].token_ids == base[0].token_ids
    assert out[0].metrics["accepted_tokens"] > 0, "the distilled draft should agree with the target sometimes"
