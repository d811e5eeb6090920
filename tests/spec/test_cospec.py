"""CoSpec: the arbitrator's hybrid mask, arbitrated verification, and toy SFT + PPO on CPU."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from selfspec.config import DraftModelConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.policy import Proposal
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.cospec import ArbitrationState, Arbitrator, CoSpecConfig, build_batch, hybrid_mask, hybrid_positions
from selfspec.spec.cospec.checkpoint import (
    load_arbitrator,
    load_arbitrator_for,
    read_checkpoint_config,
    save_arbitrator,
)
from selfspec.spec.cospec.policy import CoSpecPolicy
from selfspec.spec.draft_model import shallow_draft
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec_research.cospec.training import (
    PPOSettings,
    bce_loss,
    collect_mismatch_states,
    counterfactual_gains,
    frozen_copy,
    group_centred_advantages,
    labels_from_gains,
    ppo_step,
    sample_rollouts,
    sft_step,
    toy_reward,
)

PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "hello", "def add(a, b):"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def llm(tok):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    return LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=8, max_len=256), draft="layers:1")


@pytest.fixture(scope="module")
def arbitrator(llm):
    return Arbitrator.from_draft(llm.draft_runner.model, seed=0)


# ------------------------------------------------------------------ mask


def test_hybrid_mask_rule():
    p, d, t = 3, 2, 3  # prefix 0-2, draft 3-4, target 5-7, decision 8
    mask = hybrid_mask(p, d, t)
    assert mask.shape == (9, 9) and mask.dtype == torch.bool
    # prefix: causal
    assert mask[2, :3].all() and not mask[1, 2] and not mask[0, 1]
    assert not mask[2, 3:].any()
    # draft block: prefix + own causal past, never the target block
    assert mask[3, :4].tolist() == [True, True, True, True] and not mask[3, 4]
    assert mask[4, 3] and mask[4, 4] and not mask[4, 5:].any()
    # target block: prefix + own causal past, never the draft block
    assert mask[5, :3].all() and not mask[5, 3] and not mask[5, 4] and mask[5, 5] and not mask[5, 6]
    assert mask[7, 5:8].all() and not mask[7, 3:5].any() and not mask[7, 8]
    # decision: everything
    assert mask[8].all()
    # nothing but the decision row sees the decision token
    assert not mask[:8, 8].any()
    assert hybrid_positions(p, d, t).tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6]


def test_device_layout_is_the_mask_rule_with_padding():
    """`hybrid_layout` (what the CUDA graphs compute from three integers) equals
    `hybrid_mask`/`hybrid_positions` on the real rows, and padding is self-only and unseen."""
    from selfspec.spec.cospec.arbitrator import hybrid_layout

    cases = [(1, 1, 1), (3, 2, 3), (7, 1, 2), (12, 5, 6), (4, 8, 9)]
    width = 32
    positions, allowed, decision = hybrid_layout(torch.tensor(cases), width)
    assert positions.shape == (5, width) and allowed.shape == (5, width, width)
    for b, (p, d, t) in enumerate(cases):
        n = p + d + t + 1
        assert torch.equal(allowed[b, :n, :n], hybrid_mask(p, d, t))
        assert positions[b, :n].tolist() == hybrid_positions(p, d, t).tolist()
        assert int(decision[b]) == n - 1
        assert not allowed[b, :n, n:].any()  # no real row sees padding
        assert torch.equal(allowed[b, n:, :], torch.eye(width, dtype=torch.bool)[n:])  # padding sees itself
        assert (positions[b, n:] == 0).all()


def test_blocks_do_not_see_each_other_and_padding_is_invisible(arbitrator):
    state = ArbitrationState(prefix=(10, 11, 12, 13), draft_block=(20, 21), target_block=(30, 31, 32))
    other_draft = ArbitrationState(prefix=state.prefix, draft_block=(40, 41), target_block=state.target_block)
    other_target = ArbitrationState(prefix=state.prefix, draft_block=state.draft_block, target_block=(40, 41, 42))
    with torch.inference_mode():
        hidden = arbitrator.hidden_states(build_batch([state, other_draft, other_target]))
    # columns: prefix 0-3, draft 4-5, target 6-8, decision 9
    torch.testing.assert_close(hidden[0, 6:9], hidden[1, 6:9])  # target block ignores the draft block
    torch.testing.assert_close(hidden[0, :6], hidden[2, :6])  # prefix and draft block ignore the target
    assert not torch.allclose(hidden[0, 9], hidden[1, 9]) and not torch.allclose(hidden[0, 9], hidden[2, 9])
    # A longer neighbour in the batch (right padding) does not change a state's probability.
    longer = ArbitrationState(prefix=tuple(range(50, 70)), draft_block=(20, 21, 22), target_block=(30, 31, 32, 33))
    alone = arbitrator.keep_probability([state])
    padded = arbitrator.keep_probability([state, longer])
    torch.testing.assert_close(alone[0], padded[0], rtol=1e-5, atol=1e-6)


def test_sliding_window_family_gets_the_hybrid_mask_too(tok):
    """Gemma-3 has sliding layers: the arbitrator passes a per-layer-type mask dict."""
    target = tiny_model("gemma3", len(tok), seed=2, num_layers=3, sliding_window=4)
    draft_module = LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=1, max_len=64), draft="layers:2")
    arbitrator = Arbitrator.from_draft(draft_module.draft_runner.model)
    assert arbitrator.sliding_window == 4
    state = ArbitrationState(prefix=tuple(range(10, 20)), draft_block=(20, 21), target_block=(30, 31, 32))
    other_draft = ArbitrationState(prefix=state.prefix, draft_block=(40, 41), target_block=state.target_block)
    with torch.inference_mode():
        hidden = arbitrator.hidden_states(build_batch([state, other_draft]))
    torch.testing.assert_close(hidden[0, 12:15], hidden[1, 12:15])
    probs = arbitrator.keep_probability([state, other_draft])
    assert ((probs >= 0) & (probs <= 1)).all()


def test_arbitrator_of_a_fused_draft_runs_its_own_modules(tok):
    """On a GPU the engine fuses the target (closures over the original modules): the
    arbitrator's backbone copy drops them, so LoRA wraps what actually runs."""
    from selfspec.engine.fusion import compile_pointwise_modules

    target = tiny_model("llama", len(tok), seed=5, num_layers=2)
    plain = Arbitrator.from_draft(shallow_draft(target, 1), seed=3)
    fused_target = copy.deepcopy(target)
    compile_pointwise_modules(fused_target, backend="aot_eager")
    fused = Arbitrator.from_draft(shallow_draft(fused_target, 1), seed=3)
    assert not any(getattr(m.__dict__.get("forward"), "_selfspec_fused", False) for m in fused.backbone.modules())
    with torch.no_grad():
        for name, param in fused.named_parameters():
            if "lora_B" in name:
                param.add_(0.1)  # a LoRA that is bypassed would not change the output
        for name, param in plain.named_parameters():
            if "lora_B" in name:
                param.add_(0.1)
    state = ArbitrationState(prefix=(3, 4, 5, 6), draft_block=(7, 8), target_block=(9, 10, 11))
    torch.testing.assert_close(fused.keep_logits([state]), plain.keep_logits([state]), rtol=1e-5, atol=1e-5)


def test_head_is_a_probability_and_lora_leaves_the_target_alone(llm, arbitrator):
    states = [
        ArbitrationState(prefix=(1, 2, 3), draft_block=(5, 6), target_block=(7, 8, 9)),
        ArbitrationState(prefix=tuple(range(1, 40)), draft_block=(5,), target_block=(7, 8)),
    ]
    probs = arbitrator.keep_probability(states)
    assert probs.shape == (2,) and ((probs >= 0) & (probs <= 1)).all()
    trainable = [n for n, p in arbitrator.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    assert any("lora_A" in n for n in trainable) and "head.weight" in trainable
    # LoRA was injected into a copy: the (weight-sharing) draft and the target stay plain.
    assert type(llm.model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert type(llm.draft_runner.model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    lora_module = arbitrator.backbone.layers[0].self_attn.q_proj
    assert lora_module.r["default"] == 16 and lora_module.scaling["default"] == 2.0


def test_save_and_load_round_trip(llm, arbitrator, tmp_path):
    state = ArbitrationState(prefix=(10, 11, 12), draft_block=(20, 21), target_block=(30, 31, 32))
    trained = Arbitrator.from_draft(llm.draft_runner.model, seed=3)
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)  # B starts at zero: make the adapters matter
    trained.save(tmp_path / "arb")
    restored = Arbitrator.load(tmp_path / "arb", llm.draft_runner.model)
    torch.testing.assert_close(restored.keep_probability([state]), trained.keep_probability([state]))
    assert not torch.allclose(restored.keep_probability([state]), arbitrator.keep_probability([state]))


def _trained_copy(llm, seed: int = 3) -> Arbitrator:
    """A fresh arbitrator whose adapters and head are moved off their init (so they matter)."""
    trained = Arbitrator.from_draft(llm.draft_runner.model, seed=seed)
    with torch.no_grad():
        for name, param in trained.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
        trained.head.bias.add_(0.3)
    return trained


def test_checkpoint_files_and_identical_head_outputs(llm, arbitrator, tmp_path):
    import json

    trained = _trained_copy(llm)
    path = save_arbitrator(
        trained, tmp_path / "arb", draft="layers:1", target="tiny-target", training={"data_seeds": [7]}
    )
    names = {p.name for p in path.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "head.safetensors", "arbitrator.json"} <= names
    config = read_checkpoint_config(path)
    assert (config.lora.r, config.lora.alpha, config.lora.dropout) == (16, 32, 0.05)
    assert (config.draft, config.target, config.draft_layers) == ("layers:1", "tiny-target", 1)
    assert config.training == {"data_seeds": [7]}
    peft_config = json.loads((path / "adapter_config.json").read_text())
    assert peft_config["r"] == 16 and peft_config["lora_alpha"] == 32
    restored = load_arbitrator(path, llm.draft_runner.model)
    states = [
        ArbitrationState(prefix=(10, 11, 12), draft_block=(20, 21), target_block=(30, 31, 32)),
        ArbitrationState(prefix=tuple(range(40, 70)), draft_block=(5,), target_block=(7, 8)),
    ]
    with torch.inference_mode():
        assert torch.equal(restored(build_batch(states)), trained(build_batch(states)))
    assert not torch.allclose(restored.keep_probability(states), arbitrator.keep_probability(states))
    assert restored.identity == {"draft": "layers:1", "target": "tiny-target", "training": {"data_seeds": [7]}}
    # Saving the reloaded arbitrator again keeps its recorded identity.
    again = read_checkpoint_config(save_arbitrator(restored, tmp_path / "again"))
    assert (again.draft, again.target, again.training) == ("layers:1", "tiny-target", {"data_seeds": [7]})


def test_checkpoint_refuses_another_draft_or_target(llm, tmp_path):
    path = save_arbitrator(_trained_copy(llm), tmp_path / "arb", draft="layers:1", target="tiny-target")
    with pytest.raises(ValueError, match="draft_layers=1"):
        load_arbitrator(path, shallow_draft(llm.model, 2))
    with pytest.raises(ValueError, match="target"):
        load_arbitrator(path, llm.draft_runner.model, target="another-model")
    with pytest.raises(ValueError, match="draft"):
        load_arbitrator(path, llm.draft_runner.model, draft="layers:2")
    with pytest.raises(FileNotFoundError):
        read_checkpoint_config(tmp_path / "missing")


def test_load_for_an_llm_attaches_the_recorded_draft(llm, tok, tmp_path):
    trained = _trained_copy(llm)
    path = save_arbitrator(trained, tmp_path / "arb", draft="layers:1")
    fresh = LLM.from_model(llm.model, tok, engine_config=EngineConfig(num_slots=2, max_len=128))
    assert fresh.draft_runner is None
    restored = load_arbitrator_for(fresh, path)
    assert fresh.draft_spec == "layers:1" and len(fresh.draft_runner.model.model.layers) == 1
    state = ArbitrationState(prefix=(10, 11, 12), draft_block=(20, 21), target_block=(30, 31, 32))
    torch.testing.assert_close(restored.keep_probability([state]), trained.keep_probability([state]), rtol=0, atol=0)
    out = fresh.generate(
        PROMPTS[:2],
        SamplingParams(max_tokens=12),
        spec=CoSpecConfig(num_speculative_tokens=4, threshold=0.5, arbitrator=restored),
    )
    assert all(o.metrics["lossy"] is True for o in out)


# ------------------------------------------------------------------ verification rule


class _FixedArbitrator(Arbitrator):
    """A real Arbitrator whose head is replaced by a constant: a known π for the rule test."""

    def __init__(self, probability: float) -> None:
        torch.nn.Module.__init__(self)
        self.head = torch.nn.Linear(1, 1)
        self.probability = probability
        self.calls: list[ArbitrationState] = []

    def keep_probability(self, states):
        self.calls.extend(states)
        return torch.full((len(states),), self.probability)


def _verify(policy: CoSpecPolicy, draft: list[int], targets: list[int]):
    logits = torch.nn.functional.one_hot(torch.tensor(targets), 50).float()
    seq = SimpleNamespace(token_ids=[1, 2, 3])
    return policy.verify(None, seq, logits, Proposal(draft))


@pytest.mark.parametrize(
    "probability, threshold, max_arbitrations, expected, kept",
    [
        (0.7, 0.6, 1, (3, 9), 1),  # keep d1, accept the match d2, stop at the second mismatch with t3
        (0.7, 0.6, 2, (4, 11), 2),  # the second mismatch is arbitrated too: all kept, bonus token
        (0.5, 0.6, 1, (1, 8), 0),  # π below λ: the target's token, as SpS
        (1.0, 1.01, 1, (1, 8), 0),  # λ > 1 never keeps
        (1.0, 1.0, 1, (1, 8), 0),  # λ = 1 never keeps either, even at a saturated π = 1
        (0.0, 0.0, 1, (3, 9), 1),  # λ = 0 always keeps
    ],
)
def test_arbitrated_verification_rule(probability, threshold, max_arbitrations, expected, kept):
    arbitrator = _FixedArbitrator(probability)
    policy = CoSpecPolicy(
        None,
        thinking=False,
        proposer=None,
        arbitrator=arbitrator,
        threshold=threshold,
        max_arbitrations=max_arbitrations,
    )
    draft, targets = [4, 5, 6, 7], [4, 8, 6, 9, 11]
    result = _verify(policy, draft, targets)
    assert (result.num_accepted, result.next_token) == expected
    first = arbitrator.calls[0]
    assert first.prefix == (1, 2, 3, 4) and first.draft_block == (5, 6, 7) and first.target_block == (8, 6, 9, 11)
    report = policy.report()
    assert report.pop("arbitration_s") >= 0.0  # wall time in the arbitrator, in every speed figure
    assert report == {
        "lossy": True,
        "cospec_threshold": threshold,
        "arbitrations": len(arbitrator.calls),
        "kept_draft_tokens": kept,
        "arbitration_prefix_window": "sliding",
    }


# ------------------------------------------------------------------ end to end


def test_threshold_above_one_is_plain_greedy(llm, arbitrator):
    params = SamplingParams(max_tokens=40)
    base = llm.generate(PROMPTS, params, spec="off")
    out = llm.generate(
        PROMPTS, params, spec=CoSpecConfig(num_speculative_tokens=4, threshold=1.01, arbitrator=arbitrator)
    )
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
        assert o.metrics["lossy"] is True and o.metrics["kept_draft_tokens"] == 0
    assert sum(o.metrics["arbitrations"] for o in out) > 0, "the arbitrator was never consulted"
    assert llm.draft_runner.slots.num_used == 0, "draft slots leaked"


def test_threshold_zero_keeps_every_arbitrated_token_and_beats_sps(llm, arbitrator):
    params = SamplingParams(max_tokens=40)
    sps = llm.generate(PROMPTS, params, spec=DraftModelConfig(num_speculative_tokens=4))
    out = llm.generate(
        PROMPTS, params, spec=CoSpecConfig(num_speculative_tokens=4, threshold=0.0, arbitrator=arbitrator)
    )
    kept = sum(o.metrics["kept_draft_tokens"] for o in out)
    assert kept > 0 and kept == sum(o.metrics["arbitrations"] for o in out)

    def per_forward(results):
        return sum(r.metrics["accepted_tokens"] for r in results) / sum(r.metrics["verify_steps"] for r in results)

    assert per_forward(out) > per_forward(sps)
    assert any(o.token_ids != s.token_ids for o, s in zip(out, sps)), "kept draft tokens must change the output"


def test_config_rejects_what_it_cannot_do(llm, arbitrator):
    with pytest.raises(ValueError, match="greedy"):
        llm.submit("hi", SamplingParams(max_tokens=4, temperature=0.8), spec=CoSpecConfig(arbitrator=arbitrator))
    with pytest.raises(ValueError, match="arbitrator"):
        llm.submit("hi", SamplingParams(max_tokens=4), spec=CoSpecConfig(threshold=0.6))
    plain = LLM.from_model(llm.model, llm.tokenizer, engine_config=EngineConfig(num_slots=2, max_len=64))
    with pytest.raises(ValueError, match="draft model"):
        plain.submit("hi", SamplingParams(max_tokens=4), spec=CoSpecConfig(arbitrator=arbitrator))


# ------------------------------------------------------------------ training


def test_group_centred_advantages():
    rewards = torch.tensor([1.0, 3.0, 0.0, 0.0, 2.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    assert group_centred_advantages(rewards, groups).tolist() == [-1.0, 1.0, 0.0, 0.0, -1.0, 1.0]


def _toy_run(llm, seed: int):
    """Collect SpS mismatch states, label them counterfactually, 6 SFT steps, 3 PPO steps."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        states = collect_mismatch_states(llm, PROMPTS, num_speculative_tokens=4, max_tokens=24)
        gains = counterfactual_gains(llm.model, states, horizon=4)
        labels = labels_from_gains(gains, margin=3.0)
        arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=seed)
        optimizer = torch.optim.AdamW(arbitrator.trainable_parameters(), lr=3e-3)
        with torch.no_grad():
            bce_before = float(bce_loss(arbitrator, states, labels))
        for _ in range(6):
            sft_step(arbitrator, optimizer, states, labels)
        with torch.no_grad():
            bce_after = float(bce_loss(arbitrator, states, labels))
        reference = frozen_copy(arbitrator)
        sft_probs = arbitrator.keep_probability(states)
        generator = torch.Generator().manual_seed(seed)
        rl_optimizer = torch.optim.AdamW(arbitrator.trainable_parameters(), lr=3e-3)
        settings = PPOSettings()
        stats = []
        for _ in range(3):
            batch = sample_rollouts(arbitrator, states, toy_reward(gains), settings.group_size, generator)
            stats.append(ppo_step(arbitrator, reference, rl_optimizer, batch, settings))
        rl_probs = arbitrator.keep_probability(states)
    return states, labels, bce_before, bce_after, sft_probs, rl_probs, stats, reference


def test_toy_sft_then_ppo_is_deterministic_and_learns(llm):
    states, labels, bce_before, bce_after, sft_probs, rl_probs, stats, reference = _toy_run(llm, seed=0)
    assert len(states) >= 20
    assert 0.2 < float(labels.mean()) < 0.8, "the toy labels should hold both classes"
    assert bce_after < bce_before - 0.05
    assert (rl_probs - sft_probs).abs().max() > 1e-3, "PPO did not change the policy"
    assert all(torch.isfinite(torch.tensor(list(s.values()))).all() for s in stats)
    assert stats[-1]["kl"] > 0.0
    assert torch.equal(reference.keep_probability(states), sft_probs), "the reference must stay frozen"
    again = _toy_run(llm, seed=0)
    assert again[2:4] == (bce_before, bce_after)
    assert torch.equal(again[5], rl_probs)


# ------------------------------------------------------------------ graph buckets


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_bucket_padded_forward_matches_the_unpadded_one(tok, family):
    """The CUDA-graph path pads a state to a width bucket; its logit must be the eager one.

    Run here without capture (CPU): the same static buffers and body the GPU replays.
    """
    from selfspec.spec.cospec.graphs import ArbitratorGraphs

    target = tiny_model(family, len(tok), seed=5, num_layers=3, eos_token_id=tok.eos_token_id, sliding_window=4)
    pair = LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=1, max_len=128), draft="layers:2")
    arbitrator = _trained_copy(pair)
    graphs = ArbitratorGraphs(arbitrator, capture=False, buckets=(16, 32, 64))
    states = [
        ArbitrationState(prefix=tuple(range(10, 15)), draft_block=(20, 21, 22), target_block=(30, 31, 32, 33)),
        ArbitrationState(prefix=tuple(range(5, 45)), draft_block=(7,), target_block=(8, 9)),
    ]
    for state in states:
        eager = arbitrator.keep_logits([state])
        padded = graphs.keep_logits(state)
        torch.testing.assert_close(padded, eager, rtol=1e-5, atol=1e-5)
    assert graphs.keep_logits(ArbitrationState(prefix=tuple(range(70)), draft_block=(1,), target_block=(2,))) is None
    assert sorted(graphs.captured) == [16, 32, 64]  # every bucket up to the widest used, built once
    assert graphs.stats()["replays"] == 2


def test_graphs_are_not_copied_with_the_arbitrator(llm):
    """RL deep-copies the arbitrator as its frozen reference: graph state must stay behind."""
    import copy

    from selfspec.spec.cospec.graphs import _GRAPHS, graphs_for

    arbitrator = _trained_copy(llm)
    graphs = graphs_for(arbitrator)
    reference = copy.deepcopy(arbitrator)
    assert graphs_for(reference) is not graphs
    assert _GRAPHS[arbitrator] is graphs
