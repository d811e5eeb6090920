"""Bad input gets a clear error naming the problem, and running requests are unaffected."""

from __future__ import annotations

import math

import pytest

from selfspec.engine.llm_engine import EngineConfig, PromptTooLongError
from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
from selfspec.llm import LLM
from selfspec.models import ModelNotFoundError
from selfspec.spec.ssr import SSRConfig
from selfspec.testing.tiny import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def llm():
    tok = tiny_tokenizer()
    return LLM.from_model(
        tiny_model("qwen3", len(tok), seed=2), tok, engine_config=EngineConfig(num_slots=4, max_len=64)
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidSamplingParams, match=field):
        SamplingParams(**kwargs)


def test_unknown_model_name_and_path():
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        LLM("no-such-model")
    with pytest.raises(ModelNotFoundError, match="/nonexistent/model/dir"):
        LLM("/nonexistent/model/dir")


def test_bad_prompts_raise_and_leave_running_requests_alone(llm):
    engine = llm.engine
    running = llm.submit("The quick brown fox", SamplingParams(max_tokens=20))
    engine.step()
    with pytest.raises(ValueError, match="empty prompt"):
        llm.submit("", SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="empty prompt"):
        llm.submit([], SamplingParams(max_tokens=5))
    with pytest.raises(PromptTooLongError, match="does not fit the context of 64"):
        llm.submit("word " * 200, SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.submit([1, 2, 10**6], SamplingParams(max_tokens=5))
    with pytest.raises(ValueError):
        llm.submit([{"role": "wizard", "content": "hi"}], SamplingParams(max_tokens=5))
    with pytest.raises(ValueError, match="draft"):
        SSRConfig(draft_budgets=[], draft_interval=None)
    llm.run_until_done([running])
    (alone,) = llm.generate("The quick brown fox", SamplingParams(max_tokens=20))
    assert llm.result(running).token_ids == alone.token_ids
    assert engine.scheduler.slots.num_used == 0


def test_generation_stops_when_the_context_is_full(llm):
    (r,) = llm.generate("The quick brown fox", SamplingParams(max_tokens=500, ignore_eos=True))
    assert r.finish_reason == "length" and r.finish_detail == "context full"
    assert len(r.prompt_token_ids) + len(r.token_ids) == 64


def test_slots_sized_from_free_memory():
    from selfspec.engine.kv_cache import SlotKVCache
    from selfspec.engine.llm_engine import Engine

    model = tiny_model("llama", 64, seed=1)
    engine = Engine(model, None, EngineConfig(num_slots=0, max_len=128, memory_fraction=0.01), eos_token_ids=[])
    assert 1 <= engine.config.num_slots <= 256
    assert engine.runner.cache.num_slots == engine.config.num_slots
    assert (
        SlotKVCache.bytes_per_slot(model.config, 128, model.dtype) == 2 * 2 * 2 * 128 * 16 * 4
    )  # layers, kv heads, head dim 16
    with pytest.raises(ValueError, match="num_slots"):
        EngineConfig(num_slots=-1).validate()
