"""`EngineConfig.max_step_tokens`: under load each row's proposal shrinks to fit; outputs do not change."""

from __future__ import annotations

import pytest

from selfspec.config import PromptLookupConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer
from selfspec.thinking.policy import ThinkingLimits

PROMPTS = ["a b c a b c a b", "the cat the cat the", "1 2 3 1 2 3 1", "x y x y x y x y x"]


def _llm(max_step_tokens):
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), seed=5, num_layers=2, eos_token_id=tok.eos_token_id)
    llm = LLM.from_model(
        model, tok, engine_config=EngineConfig(num_slots=16, max_len=512, max_step_tokens=max_step_tokens)
    )
    fed: list[list[int]] = []
    run = llm.engine.runner.run

    def recording_run(chunks, needs_logits, **kwargs):
        # Decode/verify rows only (every fed token gets logits); steps with a prompt chunk are skipped.
        if all(c.num_logits == len(c.token_ids) for c in chunks):
            fed.append([len(c.token_ids) for c in chunks])
        return run(chunks, needs_logits, **kwargs)

    llm.engine.runner.run = recording_run
    return llm, fed


@pytest.mark.parametrize(
    "spec",
    [
        PromptLookupConfig(num_tokens=10),
        SSRConfig(draft_budgets=[8], max_draft_len=40, speculate_thinking=True, thinking_speculator="ngram"),
    ],
    ids=["prompt-lookup", "ssr+lookup"],
)
def test_budget_cuts_proposals_and_keeps_the_output(spec):
    params = SamplingParams(max_tokens=80)
    limits = ThinkingLimits(cot_cap=30, answer_cap=30, fixed_length=True)
    free, free_fed = _llm(None)
    tight, tight_fed = _llm(12)
    base = free.generate(PROMPTS, params, limits=limits, thinking=True, spec="off")
    unlimited = free.generate(PROMPTS, params, limits=limits, spec=spec)
    limited = tight.generate(PROMPTS, params, limits=limits, spec=spec)
    assert [o.token_ids for o in limited] == [o.token_ids for o in base] == [o.token_ids for o in unlimited]
    assert max(len(f) for f in tight_fed) >= len(PROMPTS), "the requests never shared a step"
    assert all(sum(f) <= 12 for f in tight_fed), max(tight_fed, key=sum)
    assert max(sum(f) for f in free_fed) > 12, "the budget never bound"


def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="max_step_tokens"):
        EngineConfig(max_step_tokens=0).validate()
