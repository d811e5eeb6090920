"""Request validation that matches OpenAI's: what it refuses is a 400 naming the field, what it
accepts (nulls for defaults, refusal parts, `include_obfuscation`) works; and SSR never turns
thinking on silently for a model that does not think by default.
"""

from __future__ import annotations

import httpx
import pytest

from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.cli import load_llm
from selfspec.server.config import RequestDefaults
from selfspec.server.errors import APIError
from selfspec.server.request_plan import RequestPlanner
from selfspec.server.schemas import ChatCompletionRequest
from selfspec.spec.ssr import SSRConfig

MODEL = "tiny"
USER = {"role": "user", "content": "Hello"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(load_llm(MODEL, num_slots=2, max_len=512), ServerConfig([MODEL]))) as running:
        yield running


def post(server, **fields) -> httpx.Response:
    body = {"model": MODEL, "messages": [USER], "max_tokens": 4, "selfspec": {"thinking": False}, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"temperature": 2.5}, "temperature"),
        ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "content": "1"}]}, "messages.2.tool_call_id"),
        ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{x: 1"}}]}]}, "messages.1.tool_calls.0.function.arguments"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}, "response_format.json_schema.name"),
        ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "messages.0.content.0"),
    ],
    ids=["temperature>2", "tool-without-id", "arguments-not-json", "schema-without-name", "user-refusal"],
)  # fmt: skip
def test_openai_refusals_name_the_field(server, fields, param):
    response = post(server, **fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]


@pytest.mark.parametrize(
    "fields",
    [
        {"n": None, "stream": None},
        {"temperature": 2.0},
        {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
        {"messages": [USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}, USER]},
        {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "2"}]},
    ],
    ids=["nulls", "temperature-2", "include-obfuscation", "assistant-refusal", "tool-round"],
)  # fmt: skip
def test_what_openai_accepts_works(server, fields):
    response = post(server, **fields)
    assert response.status_code == 200, response.text
    if not fields.get("stream"):
        assert len(response.json()["choices"]) == 1


def test_an_assistant_refusal_renders_as_its_turns_text():
    body = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}]}
    )
    assert body.template_messages()[1] == {"role": "assistant", "content": "No."}
    assert body.n == 1 and body.stream is False


# ---------------------------------------------------------------------- SSR x thinking
@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("selfspec_weights", reason="the packaged smollm2 weights are not installed")
    return load_llm("smollm2", num_slots=2, max_len=512)


def _plan(llm, defaults: RequestDefaults, **fields):
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], "max_tokens": 8, **fields})
    return RequestPlanner(llm, defaults, 600).plan_chat(body)


def test_ssr_does_not_turn_thinking_on_for_a_model_that_does_not_think(smollm2):
    assert not smollm2.thinking_enabled(None)  # SmolLM2 thinks only when asked (prompted)
    with pytest.raises(APIError) as refused:
        _plan(smollm2, RequestDefaults(), selfspec={"ssr": True})
    assert refused.value.status == 400 and refused.value.param == "selfspec.ssr"
    assert "thinking" in refused.value.message
    asked = _plan(smollm2, RequestDefaults(), selfspec={"ssr": True, "thinking": True})
    assert asked.mode == "ssr" and asked.thinking is True
    # The server's default SSR runs on requests that think; the others run plain, without thinking.
    default_ssr = RequestDefaults(ssr=SSRConfig())
    plain = _plan(smollm2, default_ssr)
    assert plain.mode == "plain" and not smollm2.thinking_enabled(plain.thinking)
    assert _plan(smollm2, default_ssr, selfspec={"thinking": True}).mode == "ssr"


def test_ssr_still_turns_thinking_on_for_a_thinker():
    tiny = load_llm(MODEL, num_slots=2, max_len=512)
    plan = _plan(tiny, RequestDefaults(), selfspec={"ssr": True})
    assert plan.mode == "ssr" and tiny.thinking_enabled(plan.thinking)
