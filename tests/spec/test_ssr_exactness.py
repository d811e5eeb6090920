"""Every lossless mode gives the greedy baseline's tokens, in every situation SSR meets.

Two tiny models: a random Qwen3 (drafts rarely match: exercises the mismatch paths) and a
"bigram" Llama whose attention output is zeroed, so its next token depends on the current
token only; its answer after the end-of-thinking marker is the same whatever the CoT, so
drafts match and the acceptance paths (long prefixes, suffix runs) are exercised.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = [
    "What is 12 + 30?",
    "Write a counter class",
    "Route from A to B",
    "hello",
    "Records: name=Alice, age=30",
    "def add(a, b):",
    "Let me think step by step.",
    "The quick brown fox",
    "for i in range(10):",
    "Good morning and good night.",
    "If x > 3 and y < 7 then",
]

MODES = {
    "prefix": lambda b, d: SSRConfig(draft_budgets=[b], max_draft_len=d, reuse="prefix"),
    "suffix": lambda b, d: SSRConfig(draft_budgets=[b], max_draft_len=d, reuse="suffix"),
    "prefix+suffix": lambda b, d: SSRConfig(draft_budgets=[b], max_draft_len=d),
    "prefix+suffix-no-backoff": lambda b, d: SSRConfig(draft_budgets=[b], max_draft_len=d, suffix_backoff_max=0),
    "iterative": lambda b, d: SSRConfig(draft_interval=max(2, b // 2), max_draft_len=d),
    "think-speculation": lambda b, d: SSRConfig(
        draft_budgets=[b], max_draft_len=d, speculate_thinking=True, suffix_sources=["draft", "prompt", "output"]
    ),
    **{
        f"think-{kind}": lambda b, d, kind=kind: SSRConfig(
            draft_budgets=[b],
            max_draft_len=d,
            speculate_thinking=True,
            thinking_speculator=kind,
            suffix_sources=["draft", "prompt", "output"],
        )
        for kind in ("ngram", "longest")
    },
    "think-lookup-no-draft": lambda b, d: SSRConfig(  # the budget is past every CoT: no fork
        draft_budgets=[100_000], max_draft_len=d, speculate_thinking=True, thinking_speculator="ngram"
    ),
    "iterative-think-ngram": lambda b, d: SSRConfig(
        draft_interval=max(2, b // 2), max_draft_len=d, speculate_thinking=True, thinking_speculator="ngram"
    ),
    "iterative-think": lambda b, d: SSRConfig(
        draft_interval=max(2, b // 2),
        max_draft_len=d,
        speculate_thinking=True,
        suffix_sources=["draft", "prompt", "output"],
    ),
    "all-sources": lambda b, d: SSRConfig(
        draft_budgets=[b], max_draft_len=d, suffix_sources=["draft", "prompt", "output", "global"]
    ),
    "suffix-decoding": lambda b, d: SuffixDecodingConfig(),
    "suffix-global": lambda b, d: SuffixDecodingConfig(sources=["prompt", "output", "global"]),
    "prompt-lookup": lambda b, d: PromptLookupConfig(),
    "suffix+lookup": lambda b, d: SuffixDecodingConfig(with_prompt_lookup=True),
}


def _llm(model, tok) -> LLM:
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=32, max_len=512))


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def random_llm(tok):
    return _llm(tiny_model("qwen3", len(tok), seed=3, num_layers=2, eos_token_id=tok.eos_token_id), tok)


@pytest.fixture(scope="module")
def bigram_llm(tok):
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return _llm(model, tok)


def _check_all_modes(llm: LLM, limits: ThinkingLimits, budget: int, max_draft: int, prompts=PROMPTS):
    params = SamplingParams(max_tokens=1000)
    base = llm.generate(prompts, params, limits=limits, thinking=True, spec="off")
    metrics = {}
    for name, make in MODES.items():
        out = llm.generate(prompts, params, limits=limits, spec=make(budget, max_draft))
        for i, (o, b) in enumerate(zip(out, base)):
            assert o.token_ids == b.token_ids, f"mode {name}, prompt {i}: output differs from the baseline"
            assert o.finish_reason == b.finish_reason
        metrics[name] = [o.metrics for o in out]
    assert llm.engine.scheduler.slots.num_used == 0, "slots leaked"
    return base, metrics


@pytest.mark.parametrize("which", ["random", "bigram"])
def test_cot_cap_draft_longer_than_answer(which, random_llm, bigram_llm):
    llm = random_llm if which == "random" else bigram_llm
    limits = ThinkingLimits(cot_cap=40, answer_cap=10, fixed_length=True)
    base, metrics = _check_all_modes(llm, limits, budget=5, max_draft=60)
    assert all(m["thinking_closed_by"] == "cap" for m in metrics["prefix"])
    if which == "bigram":
        # The draft (35 tokens by the time thinking closes) covers the whole 10-token answer.
        assert all(m["accepted_prefix"] == 10 for m in metrics["prefix"]), metrics["prefix"]
        assert all(m["draft_tokens"] >= 30 for m in metrics["prefix"])


@pytest.mark.parametrize("which", ["random", "bigram"])
def test_answer_longer_than_draft(which, random_llm, bigram_llm):
    llm = random_llm if which == "random" else bigram_llm
    limits = ThinkingLimits(cot_cap=40, answer_cap=60, fixed_length=True)
    base, metrics = _check_all_modes(llm, limits, budget=15, max_draft=16)
    if which == "bigram":
        # The draft ends (16 tokens) before the parent closes thinking; all of it is accepted.
        assert all(m["accepted_prefix"] == 16 for m in metrics["prefix"]), metrics["prefix"]
        # Suffix decoding keeps going past the draft (the bigram answer cycles).
        assert all(m["suffix_accepted_tokens"] > 20 for m in metrics["prefix+suffix"])
        assert all(m["forwards"] < b.metrics["forwards"] for m, b in zip(metrics["prefix+suffix"], base))
        # Thinking-phase speculation verifies CoT proposals too, and saves forwards on top.
        assert all(m["thinking_verify_steps"] > 0 for m in metrics["think-speculation"])
        assert sum(m["forwards"] for m in metrics["think-speculation"]) < sum(
            m["forwards"] for m in metrics["prefix+suffix"]
        )


def _natural_format(llm: LLM, end_token: int):
    """The tiny format with a different end marker: one that the model does produce."""
    fmt = llm.thinking_format
    return dataclasses.replace(fmt, end_ids=(end_token,), end_variants=((end_token,),))


def test_thinking_ends_before_budget_no_draft(bigram_llm):
    llm = bigram_llm
    limits = ThinkingLimits(cot_cap=40, answer_cap=30)
    probe = llm.generate(PROMPTS[0], SamplingParams(max_tokens=200), limits=limits, thinking=True)[0]
    cot = probe.token_ids[:12]
    end_token = cot[6]  # the model writes this token early: make it the end marker
    original = llm.thinking_format
    llm.thinking_format = _natural_format(llm, end_token)
    try:
        base, metrics = _check_all_modes(llm, limits, budget=35, max_draft=20, prompts=PROMPTS[:1])
        assert metrics["prefix"][0]["thinking_closed_by"] == "model"
        assert metrics["prefix"][0]["drafts"] == 0
    finally:
        llm.thinking_format = original


def test_model_ends_thinking_after_budget(bigram_llm):
    """Natural close (the model's own marker) after a draft was forked: aligned verification."""
    llm = bigram_llm
    limits = ThinkingLimits(cot_cap=60, answer_cap=30)
    probe = llm.generate(PROMPTS[1], SamplingParams(max_tokens=200), limits=limits, thinking=True)[0]
    cot = probe.token_ids[:60]
    # A token whose first occurrence is late enough in the CoT to come after the budget.
    firsts = {}
    for i, t in enumerate(cot):
        firsts.setdefault(t, i)
    end_token = max(firsts, key=firsts.get)
    assert firsts[end_token] >= 8
    original = llm.thinking_format
    llm.thinking_format = _natural_format(llm, end_token)
    try:
        _, metrics = _check_all_modes(llm, limits, budget=4, max_draft=40, prompts=PROMPTS[1:2])
        assert metrics["prefix"][0]["thinking_closed_by"] == "model"
        assert metrics["prefix"][0]["drafts"] == 1
        assert metrics["think-speculation"][0]["thinking_closed_by"] == "model"
        assert metrics["think-speculation"][0]["drafts"] == 1
    finally:
        llm.thinking_format = original


def test_eos_inside_the_draft(bigram_llm):
    llm = bigram_llm
    limits = ThinkingLimits(cot_cap=30, answer_cap=40)
    probe = llm.generate(PROMPTS[2], SamplingParams(max_tokens=200, ignore_eos=True), limits=limits, thinking=True)[0]
    answer = probe.answer_token_ids
    eos = answer[5]
    saved = llm.engine.eos_token_ids
    llm.engine.eos_token_ids = frozenset({eos})
    try:
        base, metrics = _check_all_modes(llm, limits, budget=5, max_draft=40, prompts=PROMPTS[2:3])
        assert base[0].finish_reason == "stop"
        assert metrics["prefix"][0]["draft_tokens"] <= answer.index(eos) + 1  # the draft stopped at EOS
    finally:
        llm.engine.eos_token_ids = saved


def test_ssr_and_plain_requests_share_a_batch(random_llm):
    llm = random_llm
    limits = ThinkingLimits(cot_cap=24, answer_cap=20, fixed_length=True)
    params = SamplingParams(max_tokens=100)
    base = llm.generate(PROMPTS[:6], params, limits=limits, thinking=True, spec="off")
    specs = [
        None,
        SSRConfig(draft_budgets=[8]),
        SuffixDecodingConfig(),
        SSRConfig(draft_interval=5),
        None,
        PromptLookupConfig(),
    ]
    seqs = [
        llm.submit(
            p,
            SamplingParams(max_tokens=100),
            spec=s,
            limits=ThinkingLimits(cot_cap=24, answer_cap=20, fixed_length=True),
            thinking=True,
        )
        for p, s in zip(PROMPTS[:6], specs)
    ]
    llm.run_until_done(seqs)
    for s, b in zip(seqs, base):
        assert llm.result(s).token_ids == b.token_ids


def test_cancelling_an_ssr_request_frees_its_slots(random_llm):
    llm = random_llm
    engine = llm.engine
    limits = ThinkingLimits(cot_cap=40, answer_cap=20, fixed_length=True)
    (ref,) = llm.generate(PROMPTS[3], SamplingParams(max_tokens=100), limits=limits, thinking=True)
    ssr = llm.submit(
        PROMPTS[0],
        SamplingParams(max_tokens=100),
        spec=SSRConfig(draft_interval=4),
        limits=ThinkingLimits(cot_cap=40, answer_cap=20, fixed_length=True),
    )
    plain = llm.submit(
        PROMPTS[3],
        SamplingParams(max_tokens=100),
        limits=ThinkingLimits(cot_cap=40, answer_cap=20, fixed_length=True),
        thinking=True,
    )
    while not any(not c.is_finished for c in ssr.children):
        engine.step()
    assert engine.scheduler.slots.num_used == 3
    assert engine.abort_request(ssr.request_id)
    assert ssr.is_finished and all(c.is_finished for c in ssr.children)
    assert engine.scheduler.slots.num_used == 1
    llm.run_until_done([plain])
    assert llm.result(plain).token_ids == ref.token_ids
    assert engine.scheduler.slots.num_used == 0


def test_suffix_backoff_cuts_failed_verifies_not_tokens(random_llm):
    """Drafts of a random model rarely match: back-off skips proposals, tokens stay the same."""
    llm = random_llm
    limits = ThinkingLimits(cot_cap=30, answer_cap=60, fixed_length=True)
    params = SamplingParams(max_tokens=1000)
    runs = {}
    for cap in (0, 16):
        spec = SSRConfig(
            draft_budgets=[5],
            max_draft_len=80,
            reuse="suffix",
            suffix_backoff_max=cap,
            suffix_sources=["draft", "output"],
        )
        runs[cap] = llm.generate(PROMPTS[:4], params, limits=limits, spec=spec)
    for a, b in zip(runs[0], runs[16]):
        assert a.token_ids == b.token_ids
    verifies = {cap: sum(r.metrics["answer_verify_steps"] for r in out) for cap, out in runs.items()}
    skipped = sum(r.metrics["suffix_skipped_steps"] for r in runs[16])
    assert sum(r.metrics["suffix_skipped_steps"] for r in runs[0]) == 0
    assert skipped > 0 and verifies[16] < verifies[0], (verifies, skipped)
