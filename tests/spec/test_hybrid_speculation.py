"""Every lossless method is token-identical to greedy on hybrid linear-attention models and Gemma-4.

A verify step on a linear-attention model feeds k proposed tokens through a recurrent state that
cannot be truncated; the engine keeps the per-token states of the chunk and settles on the
accepted one. These tests run every SSR mode (prefix, suffix, prefix+suffix, iterative, with
thinking speculation), suffix decoding, prompt lookup and SpS (a shallow self-draft, which is
itself hybrid, and a separate draft) on tiny Qwen3.5, Qwen3-Next and Gemma-4 text models, and
check the sampled distribution of SSR on a hybrid model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.draft_model import DraftModelConfig
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.format import ThinkingFormat
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = ["What is 12 + 30?", "Write a counter class", "hello", "def add(a, b):"]

MODES = {
    "prefix": SSRConfig(draft_budgets=[6], max_draft_len=24, reuse="prefix"),
    "suffix": SSRConfig(draft_budgets=[6], max_draft_len=24, reuse="suffix"),
    "prefix+suffix": SSRConfig(draft_budgets=[6], max_draft_len=24),
    "iterative": SSRConfig(draft_interval=4, max_draft_len=24),
    "think-speculation": SSRConfig(
        draft_budgets=[6], max_draft_len=24, speculate_thinking=True, suffix_sources=["draft", "prompt", "output"]
    ),
    "suffix-decoding": SuffixDecodingConfig(),
    "prompt-lookup": PromptLookupConfig(),
}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next", "gemma4"])
def family_llm(request, tok):
    layers = 6 if request.param == "gemma4" else 4
    model = tiny_model(request.param, len(tok), seed=3, num_layers=layers, eos_token_id=tok.eos_token_id)
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=24, max_len=256))


def test_every_lossless_mode_is_token_identical(family_llm):
    """The bigram-free random model: drafts mostly mismatch, so verify steps reject often."""
    llm = family_llm
    limits = ThinkingLimits(cot_cap=24, answer_cap=16, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    verified = 0
    for name, spec in MODES.items():
        out = llm.generate(PROMPTS, params, limits=limits, spec=spec)
        for i, (o, b) in enumerate(zip(out, base)):
            assert o.token_ids == b.token_ids, f"mode {name}, prompt {i}: output differs from the baseline"
        verified += sum(o.metrics.get("verify_steps", 0) for o in out)
    assert verified > 0, "no proposal was ever verified: the modes were not exercised"
    assert llm.engine.scheduler.slots.num_used == 0, "slots leaked"


def _bigram(model) -> None:
    """Zero the attention and linear-attention outputs: the next token then depends on the
    current one only, so SSR's drafts match the answer and long proposals are accepted."""
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("self_attn", "linear_attn"):
                mixer = getattr(layer, name, None)
                if mixer is not None:
                    proj = mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj
                    proj.weight.zero_()


def test_accepted_drafts_on_a_hybrid_bigram_model(tok):
    model = tiny_model("qwen3_5", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    _bigram(model)
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=24, max_len=256))
    limits = ThinkingLimits(cot_cap=30, answer_cap=30, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    for name in ("prefix+suffix", "iterative", "suffix-decoding"):
        out = llm.generate(PROMPTS, params, limits=limits, spec=MODES[name])
        assert [o.token_ids for o in out] == [b.token_ids for b in base], name
        if name == "prefix+suffix":
            assert sum(o.metrics["accepted_prefix"] for o in out) > 0


@pytest.mark.parametrize("draft_kind", ["shallow", "separate"])
def test_sps_greedy_is_token_identical_on_a_hybrid_target(tok, draft_kind):
    target = tiny_model("qwen3_5", len(tok), seed=4, num_layers=4, eos_token_id=tok.eos_token_id)
    draft = "layers:2" if draft_kind == "shallow" else tiny_model("qwen3_next", len(tok), seed=9, num_layers=2)
    llm = LLM.from_model(target, tok, engine_config=EngineConfig(num_slots=8, max_len=256), draft=draft)
    limits = ThinkingLimits(cot_cap=20, answer_cap=16, fixed_length=True)
    params = SamplingParams(max_tokens=100)
    base = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    out = llm.generate(PROMPTS, params, limits=limits, thinking=True, spec=DraftModelConfig(num_speculative_tokens=4))
    for o, b in zip(out, base):
        assert o.token_ids == b.token_ids
        assert o.metrics["proposed_tokens"] > 0
    assert llm.draft_runner.runner.stateful
    assert llm.draft_runner.slots.num_used == 0, "draft slots leaked"
    if draft_kind == "shallow":
        assert sum(o.metrics["accepted_tokens"] for o in out) > 0


# ---------------------------------------------------------------------------------- sampling
VOCAB = 6
CLOSE = 5
PROMPT = [1, 2, 3, 1]
COT = 3
ANSWER = 2


def _toy_format() -> ThinkingFormat:
    return ThinkingFormat(
        kind="native",
        start_marker="<t>",
        end_marker="</t>",
        start_ids=(4,),
        end_ids=(CLOSE,),
        close_ids=(CLOSE,),
        end_variants=((CLOSE,),),
        template_opens_thinking=False,
        template_takes_enable_thinking=False,
    )


def _sample_reference(model, n: int) -> np.ndarray:
    """transformers' sampling: the CoT up to the cap, the close marker, then the answer."""
    torch.manual_seed(0)
    prompts = torch.tensor([PROMPT] * n)
    kw = dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        cot = model.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=COT, min_new_tokens=COT, **kw
        )
        closed = torch.cat([cot, torch.full((n, 1), CLOSE)], dim=1)
        full = model.generate(
            closed, attention_mask=torch.ones_like(closed), max_new_tokens=ANSWER, min_new_tokens=ANSWER, **kw
        )
    return full[:, closed.shape[1] :].numpy()


@pytest.mark.parametrize("n", [1_000, pytest.param(6_000, marks=pytest.mark.slow)])
def test_ssr_sampling_preserves_the_distribution_on_a_hybrid_model(n):
    model = tiny_model("qwen3_5", VOCAB, seed=11, num_layers=2, hidden=32, initializer_range=0.15)
    reference = _sample_reference(model, n)
    llm = LLM.from_model(
        model, None, engine_config=EngineConfig(num_slots=512, max_len=32), thinking_format=_toy_format()
    )
    spec = SSRConfig(draft_budgets=[1], max_draft_len=6, reuse="prefix+suffix")
    limits = ThinkingLimits(cot_cap=COT, answer_cap=ANSWER, fixed_length=True)
    answers, accepted = [], 0
    for start in range(0, n, 250):
        seqs = [
            llm.submit(
                PROMPT,
                SamplingParams(max_tokens=16, temperature=1.0, seed=start + i),
                spec=spec,
                limits=limits,
                thinking=True,
            )
            for i in range(250)
        ]
        llm.run_until_done(seqs)
        for s in seqs:
            r = llm.result(s)
            answers.append(r.answer_token_ids[:ANSWER])
            accepted += r.metrics["accepted_prefix"]
    assert accepted / n > 0.2, "drafts were hardly ever accepted: verification not exercised"
    answers = np.array(answers)
    for pos in range(ANSWER):
        table = np.array(
            [np.bincount(reference[:, pos], minlength=VOCAB), np.bincount(answers[:, pos], minlength=VOCAB)]
        )
        table = table[:, table.sum(axis=0) >= 20]
        p = chi2_contingency(table)[1]
        assert p > 0.01, f"answer position {pos}: p={p:.4g}"
