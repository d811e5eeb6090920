"""SSR with sampling preserves the model's distribution (chi-square, tiny vocabulary).

Reference: transformers' own `generate(do_sample=True)` in two stages (sample the CoT up to
the cap, append the end-of-thinking tokens, sample the answer), 20,000 rows at once. SSR:
20,000 requests through the engine, drafts forked mid-CoT and verified by rejection
sampling, with both verifier kinds (deterministic proposals, and the draft's own
probabilities). The answer tokens at fixed positions must follow the same distribution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model
from selfspec.thinking.format import ThinkingFormat
from selfspec.thinking.policy import ThinkingLimits

VOCAB = 6
CLOSE = 5  # the end-of-thinking token of this toy format
PROMPT = [1, 2, 3, 1]
COT = 4
ANSWER = 2
N = 20_000


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", VOCAB, seed=11, num_layers=1, hidden=32, initializer_range=0.15)


@pytest.fixture(scope="module")
def reference_answers(model):
    torch.manual_seed(0)
    # Explicit all-ones masks: otherwise generate masks every sampled token equal to pad_token_id.
    prompts = torch.tensor([PROMPT] * N)
    with torch.inference_mode():
        cot = model.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            max_new_tokens=COT,
            min_new_tokens=COT,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            eos_token_id=None,
            pad_token_id=0,
        )
        closed = torch.cat([cot, torch.full((N, 1), CLOSE)], dim=1)
        full = model.generate(
            closed,
            attention_mask=torch.ones_like(closed),
            do_sample=True,
            max_new_tokens=ANSWER,
            min_new_tokens=ANSWER,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            eos_token_id=None,
            pad_token_id=0,
        )
    return full[:, closed.shape[1] :].numpy(), full[:, len(PROMPT) : len(PROMPT) + COT].numpy()


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


def _ssr_answers(
    model, use_draft_probs: bool, speculate_thinking: bool = False
) -> tuple[np.ndarray, np.ndarray, float, float]:
    llm = LLM.from_model(
        model, None, engine_config=EngineConfig(num_slots=512, max_len=32), thinking_format=_toy_format()
    )
    spec = SSRConfig(
        draft_budgets=[1],
        max_draft_len=6,
        reuse="prefix+suffix",
        use_draft_probs=use_draft_probs,
        speculate_thinking=speculate_thinking,
    )
    answers, cots, accepted, thinking_verifies = [], [], 0, 0
    batch = 256
    for start in range(0, N, batch):
        seqs = [
            llm.submit(
                PROMPT,
                SamplingParams(max_tokens=16, temperature=1.0, seed=start + i),
                spec=spec,
                limits=ThinkingLimits(cot_cap=COT, answer_cap=ANSWER, fixed_length=True),
                thinking=True,
            )
            for i in range(min(batch, N - start))
        ]
        llm.run_until_done(seqs)
        for s in seqs:
            r = llm.result(s)
            answers.append(r.answer_token_ids[:ANSWER])
            cots.append(s.output_ids[:COT])
            accepted += r.metrics["accepted_prefix"]
            thinking_verifies += r.metrics["thinking_verify_steps"]
    return np.array(answers), np.array(cots), accepted / N, thinking_verifies / N


def _same_distribution(a: np.ndarray, b: np.ndarray) -> float:
    table = np.array([np.bincount(a, minlength=VOCAB), np.bincount(b, minlength=VOCAB)])
    table = table[:, table.sum(axis=0) >= 20]  # drop categories too rare for chi-square
    return chi2_contingency(table)[1]


@pytest.mark.parametrize(
    "use_draft_probs,speculate_thinking",
    [(False, False), (True, False), (False, True)],
    ids=["deterministic", "draft-probs", "deterministic+thinking-speculation"],
)
def test_ssr_sampling_matches_plain_sampling(model, reference_answers, use_draft_probs, speculate_thinking):
    reference, reference_cot = reference_answers
    ssr, cot, mean_accepted, thinking_verifies = _ssr_answers(model, use_draft_probs, speculate_thinking)
    assert mean_accepted > 0.2, "drafts were hardly ever accepted: the test would not exercise verification"
    if speculate_thinking:
        assert thinking_verifies > 0.2, "CoT proposals were hardly ever made: thinking speculation not exercised"
    for pos in range(ANSWER):
        p = _same_distribution(reference[:, pos], ssr[:, pos])
        assert p > 0.01, f"answer position {pos}: p={p:.4g}"
    for pos in range(COT):
        p = _same_distribution(reference_cot[:, pos], cot[:, pos])
        assert p > 0.01, f"CoT position {pos}: p={p:.4g}"
