"""Penalties, logprobs and n > 1 samples: their definitions, and exactness under speculation.

Penalties are checked against transformers' `RepetitionPenaltyLogitsProcessor` and the OpenAI
definition of presence / frequency penalties on the same logits, then end to end: greedy decoding
with a repetition penalty equals `model.generate(repetition_penalty=...)`, and every speculative
method commits the same tokens under penalties (the penalty at verified position i counts the
proposed tokens before it). Logprobs equal a log-softmax of the model's own logits for the chosen
tokens, with and without speculation (then read from the verify forward's rows).
"""

from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from selfspec.config import PromptLookupConfig, SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.logits_processing import penalized
from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = ["What is 12 + 30?", "hello", "Records: name=Alice, age=30", "The quick brown fox"]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def bigram_llm(tok):
    """Next token depends on the current one only: drafts match, speculation is accepted, and a
    penalty changes what is generated (the model loves to repeat itself)."""
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    return LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=16, max_len=256))


def _openai_penalties(logits, output_ids, presence, frequency):
    out = logits.clone()
    for token in set(output_ids):
        count = output_ids.count(token)
        out[token] -= presence + frequency * count
    return out


def test_penalties_match_transformers_and_the_openai_definitions():
    gen = torch.Generator().manual_seed(0)
    vocab = 50
    logits = torch.randn(4, vocab, generator=gen) * 3
    prompt, output, proposal = [1, 2, 3, 3], [4, 5, 5, 2], [6, 5, 7]
    params = SamplingParams(repetition_penalty=1.7)
    got = penalized(logits, params, prompt, output, proposal)
    processor = RepetitionPenaltyLogitsProcessor(1.7)
    for i in range(4):  # row i counts the first i proposed tokens as output
        ids = torch.tensor([prompt + output + proposal[:i]])
        want = processor(ids, logits[i : i + 1].clone())[0]
        torch.testing.assert_close(got[i], want)
    params = SamplingParams(presence_penalty=0.6, frequency_penalty=-0.4)
    got = penalized(logits, params, prompt, output, proposal)
    for i in range(4):
        torch.testing.assert_close(got[i], _openai_penalties(logits[i], output + proposal[:i], 0.6, -0.4))


@pytest.mark.parametrize(
    "field, value",
    [("presence_penalty", 2.5), ("frequency_penalty", float("nan")), ("repetition_penalty", 0.0), ("logprobs", 21)],
)
def test_out_of_range_values_name_their_field(field, value):
    with pytest.raises(InvalidSamplingParams, match=field):
        SamplingParams(**{field: value})


def test_greedy_with_a_repetition_penalty_equals_transformers_generate(bigram_llm, tok):
    ids = bigram_llm.encode_prompt("hello", thinking=False)
    out = bigram_llm.generate(ids, SamplingParams(max_tokens=24, repetition_penalty=1.3, ignore_eos=True))[0]
    plain = bigram_llm.generate(ids, SamplingParams(max_tokens=24, ignore_eos=True), spec="off")[0]
    ref = bigram_llm.model.generate(
        torch.tensor([ids]), max_new_tokens=24, do_sample=False, repetition_penalty=1.3, eos_token_id=None
    )[0, len(ids) :].tolist()
    assert out.token_ids == ref
    assert out.token_ids != plain.token_ids  # the penalty changed the output: the test can fail


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=40, repetition_penalty=1.05),
        SamplingParams(max_tokens=40, presence_penalty=0.1, frequency_penalty=0.05),
    ],
    ids=["repetition", "presence+frequency"],
)
def test_speculation_under_penalties_is_exact(bigram_llm, params):
    modes = [SuffixDecodingConfig(), PromptLookupConfig(), SSRConfig(draft_budgets=[4], max_draft_len=32)]
    limits = ThinkingLimits(cot_cap=8)
    base = bigram_llm.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    plain = bigram_llm.generate(PROMPTS, SamplingParams(max_tokens=40), limits=limits, thinking=True, spec="off")
    assert [b.token_ids for b in base] != [p.token_ids for p in plain]  # the penalties matter here
    for spec in modes:
        outs = bigram_llm.generate(PROMPTS, params, spec=spec, limits=limits, thinking=True)
        assert [o.token_ids for o in outs] == [b.token_ids for b in base], spec.method
        assert sum(o.metrics["accepted_tokens"] for o in outs) > 0, spec.method


@pytest.mark.parametrize("spec", [None, SuffixDecodingConfig()], ids=["plain", "suffix"])
def test_logprobs_are_the_models_log_softmax_for_the_chosen_tokens(bigram_llm, spec):
    ids = bigram_llm.encode_prompt("Records: name=Alice", thinking=False)
    out = bigram_llm.generate(ids, SamplingParams(max_tokens=20, logprobs=3, ignore_eos=True), spec=spec)[0]
    if spec is not None:
        assert out.metrics["accepted_tokens"] > 0  # logprobs came from verify rows
    with torch.no_grad():
        logits = bigram_llm.model(torch.tensor([ids + out.token_ids])).logits[0].float()
    want = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
    assert len(out.logprobs) == len(out.token_ids)
    for i, (token, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert entry.token == token
        assert entry.logprob == pytest.approx(want[i, token].item(), abs=1e-4)
        top = torch.topk(want[i], 3)
        assert [t for t, _ in entry.top] == top.indices.tolist()
        assert [lp for _, lp in entry.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def _samples(llm, seed, n=4, spec=None):
    seq = llm.submit("hello", SamplingParams(max_tokens=16, temperature=1.0, seed=seed, n=n), spec=spec, thinking=False)
    llm.run_until_done([seq])
    return seq, [llm.result(s).token_ids for s in (seq, *seq.siblings)]


def test_n_samples_share_one_prefill_and_a_seed_reproduces_them(bigram_llm):
    seq, first = _samples(bigram_llm, seed=7)
    assert len(first) == 4 and len({tuple(t) for t in first}) > 1  # distinct samples
    assert seq.stats.prefill_forwards + 1 >= 1 and all(s.stats.prefill_forwards == 0 for s in seq.siblings)
    assert all(s.prompt_len == seq.prompt_len for s in seq.siblings)
    assert _samples(bigram_llm, seed=7)[1] == first
    assert (
        _samples(bigram_llm, seed=7, spec=SuffixDecodingConfig())[1] != [] and _samples(bigram_llm, seed=8)[1] != first
    )
    single = bigram_llm.generate("hello", SamplingParams(max_tokens=16, temperature=1.0, seed=7), thinking=False)[0]
    assert single.token_ids == first[0]  # sample 0 is the n = 1 request with the same seed


def test_greedy_n_samples_are_identical_and_need_sibling_policies(bigram_llm):
    _, outs = _samples(bigram_llm, seed=None, n=3)
    seq = bigram_llm.submit("hello", SamplingParams(max_tokens=8, n=3), thinking=False)
    bigram_llm.run_until_done([seq])
    greedy = [bigram_llm.result(s).token_ids for s in (seq, *seq.siblings)]
    assert greedy[0] == greedy[1] == greedy[2]
    with pytest.raises(ValueError, match="sibling policies"):
        bigram_llm.engine.add_request([1, 2, 3], SamplingParams(n=2))
