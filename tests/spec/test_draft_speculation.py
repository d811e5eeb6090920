"""Draft-model speculation (SpS): exact under greedy, distribution-preserving under sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from selfspec.config import DraftModelConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.draft_model import shallow_draft
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = ["What is 12 + 30?", "Write a counter class", "Route from A to B", "hello", "def add(a, b):"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_shallow_draft_shares_weights_and_matches_a_truncated_forward(tok):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3)
    draft = shallow_draft(target, 1)
    assert len(draft.model.layers) == 1 and len(target.model.layers) == 3
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        hidden = target.model(ids, output_hidden_states=True).hidden_states[1]
        expected = target.lm_head(target.model.norm(hidden))
        got = draft(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        shallow_draft(target, 3)


@pytest.mark.parametrize("draft_kind", ["shallow", "separate"])
def test_sps_greedy_is_token_identical(tok, draft_kind):
    target = tiny_model("qwen3", len(tok), seed=4, num_layers=3, eos_token_id=tok.eos_token_id)
    draft = "layers:1" if draft_kind == "shallow" else tiny_model("llama", len(tok), seed=9, num_layers=1)
    llm = LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=8, max_len=256), draft=draft)
    limits = ThinkingLimits(cot_cap=30, answer_cap=25, fixed_length=True)
    params = SamplingParams(max_tokens=100)
    spec = DraftModelConfig(num_speculative_tokens=4)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    before = llm.draft_runner.forwards
    out = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec=spec)
    batched_forwards = llm.draft_runner.forwards - before
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
        assert o.metrics["proposed_tokens"] > 0
    assert llm.draft_runner.slots.num_used == 0, "draft slots leaked"
    # The sequences draft together: one draft forward per draft step for the whole batch.
    before = llm.draft_runner.forwards
    alone = [llm.generate([p], params, limits=limits, thinking=True, spec=spec)[0] for p in PROMPTS]
    assert [a.token_ids for a in alone] == [b.token_ids for b in base]
    assert batched_forwards < (llm.draft_runner.forwards - before) / 2
    if draft_kind == "shallow":
        assert sum(o.metrics["accepted_tokens"] for o in out) > 0


def test_sps_needs_a_draft_model(tok):
    llm = LLM.from_model(
        tiny_model("qwen3", len(tok), seed=4), tok, engine_config=EngineConfig(num_slots=2, max_len=64)
    )
    with pytest.raises(ValueError, match="draft model"):
        llm.submit("hi", SamplingParams(max_tokens=4), spec=DraftModelConfig())
    with pytest.raises(ValueError, match="vocabulary"):
        llm.set_draft(tiny_model("llama", 50, seed=1))


def test_sps_sampling_preserves_the_distribution():
    vocab, n = 6, 6_000
    target = tiny_model("llama", vocab, seed=11, num_layers=2, hidden=32, initializer_range=0.15)
    prompt = [1, 2, 3, 1]
    torch.manual_seed(0)
    with torch.inference_mode():
        ids = torch.tensor([prompt] * n)
        ref = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=3,
            min_new_tokens=3,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            eos_token_id=None,
            pad_token_id=0,
        )[:, len(prompt) :].numpy()
    llm = LLM.from_model(target, None, engine_config=EngineConfig(num_slots=256, max_len=16), draft="layers:1")
    spec = DraftModelConfig(num_speculative_tokens=3)
    outs, accepted = [], 0
    for start in range(0, n, 256):
        seqs = [
            llm.submit(prompt, SamplingParams(max_tokens=3, temperature=1.0, seed=start + i), spec=spec, thinking=False)
            for i in range(min(256, n - start))
        ]
        llm.run_until_done(seqs)
        outs += [s.output_ids[:3] for s in seqs]
        accepted += sum(s.stats.accepted_tokens for s in seqs)
    got = np.array(outs)
    assert accepted / n > 0.3, "the draft was hardly ever accepted: the test would not exercise verification"
    for pos in range(3):
        table = np.array([np.bincount(ref[:, pos], minlength=vocab), np.bincount(got[:, pos], minlength=vocab)])
        table = table[:, table.sum(axis=0) >= 20]
        p = chi2_contingency(table)[1]
        assert p > 0.01, f"position {pos}: p={p:.3g}"
