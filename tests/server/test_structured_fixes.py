"""Structured output and tool calls as OpenAI clients expect them: tools without parameters, big
schemas compiled off the engine loop (cached, bounded in time), streamed and non-streamed replies
that agree, logprob bytes that rebuild the text, and library errors without source paths.

Over real HTTP on the tiny random model (which never writes a call or JSON by itself: the grammar
enforces them), plus the compile service and the helpers on their own.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.choices import ChoiceOutput, chat_logprobs
from selfspec.server.cli import load_llm
from selfspec.server.errors import APIError, clean_library_message
from selfspec.server.grammar_compile import GrammarCompiles
from selfspec.server.output_text import ResponseText
from selfspec.server.structured import GrammarSpec, OutputRules
from selfspec.server.token_bytes import TokenBytes

pytest.importorskip("xgrammar")

MODEL = "tiny"
NO_PARAMS = {"type": "function", "function": {"name": "ping", "description": "Check the line"}}
EMPTY_PARAMS = {"type": "function", "function": {"name": "now", "parameters": {}}}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def big_schema(properties: int) -> dict:
    """Optional properties: xgrammar's compile time grows steeply with their number."""
    return {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(properties)}}


@pytest.fixture(scope="module")
def served():
    return load_llm(MODEL, num_slots=4, max_len=1024)


@pytest.fixture(scope="module")
def server(served):
    config = ServerConfig(served_model_names=[MODEL], grammar_compile_timeout_s=0.3)
    with BackgroundServer(create_app(served, config)) as running:
        yield running


def chat(server, timeout: float = 120.0, **fields) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 60, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=timeout)


def stream_chat(server, **fields) -> tuple[str | None, list[dict], str]:
    """Content (None when no content delta came), tool calls and the finish reason of a stream."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 60, **fields}
    content, calls, reason = None, [], None
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                delta = choice["delta"]
                if delta.get("content") is not None:
                    content = (content or "") + delta["content"]
                calls.extend(delta.get("tool_calls") or [])
                reason = choice.get("finish_reason") or reason
    return content, calls, reason


# ---------------------------------------------------------------------- tools without parameters
@pytest.mark.parametrize("tool", [NO_PARAMS, EMPTY_PARAMS], ids=["missing", "empty"])
def test_a_tool_without_parameters_is_called_with_an_empty_object(server, tool):
    name = tool["function"]["name"]
    choice = {"type": "function", "function": {"name": name}}
    response = chat(server, tools=[tool, WEATHER], tool_choice=choice, max_tokens=120, selfspec={"thinking": False})
    assert response.status_code == 200, response.text
    reply = response.json()["choices"][0]
    assert reply["finish_reason"] == "tool_calls"
    (call,) = reply["message"]["tool_calls"]
    assert call["function"]["name"] == name and json.loads(call["function"]["arguments"]) == {}


def test_a_text_format_beside_a_forced_tool_call_waits_for_a_later_turn(server):
    """Agent frameworks send their output schema with every turn, forced tool calls included
    (OpenAI accepts both): the forced turn writes only the call, so the format does not
    constrain it, and the reply is the one without the format."""
    fields = dict(tools=[WEATHER], tool_choice="required", max_tokens=120, selfspec={"thinking": False})
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "final", "schema": schema}}
    plain = chat(server, **fields)
    both = chat(server, response_format=fmt, **fields)
    assert plain.status_code == 200 == both.status_code, both.text
    reply = both.json()["choices"][0]
    assert reply["finish_reason"] == "tool_calls"
    assert reply["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    strip = lambda calls: [c["function"] for c in calls]  # noqa: E731 - call ids are random
    assert strip(reply["message"]["tool_calls"]) == strip(plain.json()["choices"][0]["message"]["tool_calls"])


# ---------------------------------------------------------------------- streamed = non-streamed
def test_streamed_tool_calls_carry_the_non_streamed_content(server):
    """Several calls: the newlines between and after them are call syntax, in both replies."""
    fields = dict(tools=[WEATHER, NO_PARAMS], tool_choice="required", max_tokens=160, selfspec={"thinking": False})
    whole = chat(server, **fields).json()["choices"][0]
    content, calls, reason = stream_chat(server, **fields)
    assert whole["finish_reason"] == reason == "tool_calls"
    assert [c["function"] for c in calls] == [c["function"] for c in whole["message"]["tool_calls"]]
    assert whole["message"]["content"] is None  # the calls alone
    assert (content or "") == ""  # no content in the stream either (its opening chunk may say "")


def test_choice_content_does_not_depend_on_chunking(served):
    """Token by token or all at once, a tool-using choice has the same content; trailing
    whitespace after calls is dropped, text before a call is kept."""
    tokenizer = served.tokenizer
    texts = [
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n',
        'Let me check.\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n',
        "No call here, just text.\n\n",
    ]  # fmt: skip
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)

        def output():
            return ChoiceOutput(ResponseText(tokenizer, thinking=False, split_reasoning=True), "hermes")

        whole = output()
        whole.update(ids, None, finished=True)
        streamed, deltas = output(), []
        for token in ids:
            deltas.append(streamed.update([token], None).content)
        deltas.append(streamed.update([], None, final_ids=ids, finished=True).content)
        assert "".join(deltas) == whole.content
        message = whole.message()
        assert (message["content"] or "") == "".join(deltas)
        if whole.tool_calls:
            assert not whole.content.endswith("\n")
    assert whole.content == texts[2]  # without calls, the text stays as written


# ---------------------------------------------------------------------- big schemas
def test_a_schema_past_the_compile_limit_is_a_400_and_the_server_goes_on(server):
    """A schema that compiles for seconds gets a 400 naming response_format after the limit
    (0.3 s here); meanwhile and afterwards plain requests are served."""
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": big_schema(1200)}}
    results = {}

    def ask_big():
        results["big"] = chat(server, response_format=fmt, max_tokens=8)

    thread = threading.Thread(target=ask_big)
    started = time.perf_counter()
    thread.start()
    time.sleep(0.05)
    plain = chat(server, max_tokens=4, selfspec={"thinking": False})
    assert plain.status_code == 200
    thread.join(60)
    big = results["big"]
    assert big.status_code == 400, big.text
    error = big.json()["error"]
    assert error["param"] == "response_format" and error["code"] == "grammar_too_complex"
    assert "compile" in error["message"] and time.perf_counter() - started < 30
    assert chat(server, max_tokens=4, selfspec={"thinking": False}).status_code == 200


def test_compiles_are_cached_and_shared(served):
    """The same schema compiles once (the second request gets the same compiled grammar); a
    queued compile that nobody waits for any more is dropped."""
    compiles = GrammarCompiles(served, timeout_s=60.0, workers=1)
    spec = GrammarSpec("json_schema", {"schema": big_schema(300), "strict": True}, "response_format")
    reordered = GrammarSpec(
        "json_schema", {"strict": True, "schema": dict(reversed(list(big_schema(300).items())))}, "response_format"
    )

    async def run():
        first, second = OutputRules(spec=spec), OutputRules(spec=reordered)
        await asyncio.gather(
            compiles.resolve(first, None, time.perf_counter() + 60),
            compiles.resolve(second, None, time.perf_counter() + 60),
        )
        return first.grammar, second.grammar

    first, second = asyncio.run(run())
    assert first is second and len(compiles) == 1
    again = OutputRules(spec=spec)
    started = time.perf_counter()
    asyncio.run(compiles.resolve(again, None, time.perf_counter() + 60))
    assert again.grammar is first and time.perf_counter() - started < 0.05

    # One worker busy with a slow compile: a second spec queues; its only waiter leaves (its
    # request's deadline passes), so the queued compile is dropped, never run.
    slow = OutputRules(spec=GrammarSpec("json_schema", {"schema": big_schema(900), "strict": False}, "x"))
    queued = OutputRules(spec=GrammarSpec("regex", "[a-z]+", "selfspec.regex"))

    async def abandon():
        slow_task = asyncio.ensure_future(compiles.resolve(slow, None, time.perf_counter() + 60))
        await asyncio.sleep(0.05)
        with pytest.raises(APIError) as refused:
            await compiles.resolve(queued, None, time.perf_counter() + 0.1)
        assert refused.value.status == 408
        await slow_task

    asyncio.run(abandon())
    assert slow.grammar is not None and queued.grammar is None
    assert len(compiles) == 2  # the first schema and the slow one; the abandoned regex is gone


# ---------------------------------------------------------------------- logprob bytes
def _byte_fallback_tokenizer():
    """A SentencePiece-style BPE with byte fallback (as Llama 2, Mistral and Gemma have)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {
        "<unk>": 0,
        **{f"<0x{b:02X}>": 1 + b for b in range(256)},
        "▁": 257,
        "h": 258,
        "i": 259,
        "hi": 260,
        "▁hi": 261,
    }
    model = models.BPE(vocab=vocab, merges=[("h", "i"), ("▁", "hi")], unk_token="<unk>", byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


class _Entry:
    def __init__(self, token: int) -> None:
        self.token, self.logprob, self.top = token, -0.5, ((token, -0.5),)


@pytest.mark.parametrize("kind", ["byte_level", "byte_fallback"])
def test_logprob_bytes_rebuild_the_text(served, kind):
    tokenizer = served.tokenizer if kind == "byte_level" else _byte_fallback_tokenizer()
    text = "hi 😀 中文 hi" if kind == "byte_fallback" else "Hi 😀 中文 🇫🇷 café"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # single tokens cannot show the emoji
    content = chat_logprobs(tokenizer, [_Entry(i) for i in ids])["content"]
    rebuilt = b"".join(bytes(item["bytes"]) for item in content).decode("utf-8")
    assert rebuilt.strip() == text
    assert all(bytes(i["top_logprobs"][0]["bytes"]) == bytes(i["bytes"]) for i in content)
    if kind == "byte_fallback":
        assert TokenBytes(tokenizer)(tokenizer.convert_tokens_to_ids("<0xF0>")) == b"\xf0"


def test_logprob_bytes_over_http_rebuild_the_content(server):
    response = chat(server, max_tokens=24, logprobs=True, selfspec={"thinking": False}, ignore_eos=True)
    reply = response.json()["choices"][0]
    rebuilt = b"".join(bytes(item["bytes"]) for item in reply["logprobs"]["content"])
    assert rebuilt.decode("utf-8", errors="replace") == reply["message"]["content"]


# ---------------------------------------------------------------------- library errors
def test_grammar_errors_reach_the_client_without_source_paths(server):
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}}, "response_format"),
        ({"selfspec": {"regex": "(unclosed"}}, "selfspec.regex"),
        ({"selfspec": {"grammar": 'root ::= undefined_rule'}}, "selfspec.grammar"),
    ]  # fmt: skip
    for fields, param in cases:
        response = chat(server, **fields)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param
        message = error["message"]
        assert ".cc" not in message and "/" not in message and "Check failed" not in message, message
        assert not message.startswith("["), message


def test_clean_library_message():
    raw = '[04:29:21] /project/cpp/json_schema_converter.cc:5082: Unsupported type "bogus"\n'
    assert clean_library_message(raw) == 'Unsupported type "bogus"'
    raw = "[10:00:00] /home/u/xgrammar/cpp/compiler.cc:77: Check failed: (n > 0) is false: empty rule\nStack trace:"
    assert clean_library_message(raw) == "empty rule"
    assert clean_library_message("a ratio of 1:2 is fine") == "a ratio of 1:2 is fine"
    assert clean_library_message("\n\n") == "rejected by the library"
