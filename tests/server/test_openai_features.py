"""What agent frameworks send on their first request, over real HTTP with the official client:
tools (a full round trip), structured output under speculation, logprobs, n samples, penalties.

The tiny random model never calls a tool or writes JSON by itself, so forced tool calls and
schemas are enforced by the grammar; every test asserts the parsed output, and compares it with
the library (or the model's own logits) where a reference exists.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.cli import load_llm
from selfspec.server.schemas import ChatCompletionRequest

pytest.importorskip("xgrammar")

MODEL = "tiny"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather by city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
ANSWER = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["yes", "no", "maybe"]},
        "sure": {"type": "boolean"},
        "note": {"type": "string", "pattern": "^[a-z]{1,8}$"},
    },
    "required": ["verdict", "sure", "note"],
    "additionalProperties": False,
}
PROMPTS = [
    "Is 7 prime?", "Is Paris in France?", "Add 12 and 30.", "Is the sky green?", "Hello, world!",
    "Count from 0 to 9.", "Is 42 even?", "Route from A to C?", "Records: name=Alice, age=30.", "Say something.",
    "def add(a, b):", "The quick brown fox", "Good morning!", "Is water wet?", "Check 4 * 5 = 20.",
    "Is Bob 25?", "for i in range(10):", "What is the capital of France?", "Is x > 3?", "Think carefully.",
]  # fmt: skip


@pytest.fixture(scope="module")
def served():
    return load_llm(MODEL, num_slots=8, max_len=1024)


@pytest.fixture(scope="module")
def library(served):
    return LLM.from_model(served.model, served.tokenizer, engine_config=EngineConfig(num_slots=8, max_len=1024))


@pytest.fixture(scope="module")
def client(served):
    server = BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL]))).start()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def _stream_message(stream) -> tuple[str, str, dict[int, dict], str]:
    """Content, reasoning, tool calls by index and the finish reason of a streamed choice 0."""
    content, reasoning, calls, reason = "", "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = entry["id"] or call.id
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            reason = choice.finish_reason or reason
    return content, reasoning, calls, reason


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_tool_call_round_trip(client, served, library, stream):
    """The model calls the named tool (enforced), the client runs it, the model answers from the
    tool's result rendered through the chat template."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = dict(model=MODEL, messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=200)
    kwargs["extra_body"] = {"selfspec": {"cot_cap": 6}}
    if stream:
        _, reasoning, calls, reason = _stream_message(client.chat.completions.create(stream=True, **kwargs))
        name, arguments, call_id = calls[0]["name"], calls[0]["arguments"], calls[0]["id"]
        assert list(calls) == [0]
    else:
        message = client.chat.completions.create(**kwargs).choices[0]
        reason, reasoning = message.finish_reason, message.message.reasoning_content
        assert message.message.content is None and len(message.message.tool_calls) == 1
        call = message.message.tool_calls[0]
        name, arguments, call_id = call.function.name, call.function.arguments, call.id
    assert reason == "tool_calls" and name == "get_weather" and call_id.startswith("call_")
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert reasoning  # thinking stayed apart from the call

    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
    ]  # fmt: skip
    follow = dict(
        model=MODEL, messages=history, tools=TOOLS, max_tokens=16, extra_body={"selfspec": {"thinking": False}}
    )
    if stream:
        content, _, calls, reason = _stream_message(client.chat.completions.create(stream=True, **follow))
        assert calls == {} or reason == "tool_calls"
    else:
        answer = client.chat.completions.create(**follow).choices[0]
        content = answer.message.content or ""
    # The reference: the library on the same conversation, rendered with the tools.
    rendered = ChatCompletionRequest.model_validate({"model": MODEL, "messages": history}).template_messages()
    ids = library.encode_prompt(rendered, thinking=False, tools=TOOLS)
    prompt = served.tokenizer.decode(ids)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt and f'"arguments": {arguments}' in prompt
    ref = library.generate(ids, SamplingParams(max_tokens=16))[0]
    assert content == ref.text


def test_tool_choice_required_gives_calls_only(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather and time?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        stream=True,
        extra_body={"selfspec": {"thinking": False}},
    )
    content, _, calls, reason = _stream_message(stream)
    assert reason == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0]["name"] in ("get_weather", "get_time")
    if calls[0]["name"] == "get_weather":
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


def _schema_answer(client, prompt, selfspec):
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}},
        logprobs=True,
        extra_body={"selfspec": {"cot_cap": 6, **selfspec}},
    )
    choice = response.choices[0]
    tokens = [item.token for item in choice.logprobs.content]
    return choice.message.content, choice.message.reasoning_content, tokens, response.usage


def test_json_schema_under_ssr_and_suffix_decoding_is_constrained_greedy(client):
    modes = {
        "plain": {"ssr": False},
        "ssr": {"ssr": {"draft_budgets": [3], "max_draft_len": 60}},
        "suffix": {"speculation": {"method": "suffix"}},
    }
    with ThreadPoolExecutor(8) as pool:
        results = {
            name: list(pool.map(lambda p, options=options: _schema_answer(client, p, options), PROMPTS))
            for name, options in modes.items()
        }
    for index, (content, reasoning, tokens, usage) in enumerate(results["plain"]):
        jsonschema.validate(json.loads(content), ANSWER)
        for name in ("ssr", "suffix"):
            other = results[name][index]
            assert other[:3] == (content, reasoning, tokens), (name, PROMPTS[index])
            assert other[3].completion_tokens == usage.completion_tokens
            assert other[3].selfspec["mode"] == name
    # Speculation really ran under the schema: SSR drafted answers, suffix decoding proposed tokens.
    assert sum(r[3].selfspec["drafts"] for r in results["ssr"]) > 0
    assert sum(r[3].selfspec["proposed_tokens"] for r in results["suffix"]) > 0


def test_logprobs_are_the_models_log_softmax(client, served, library):
    messages = [{"role": "user", "content": "Hello, world!"}]
    for selfspec in ({}, {"speculation": {"method": "suffix"}}):
        response = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=12,
            logprobs=True,
            top_logprobs=3,
            extra_body={"selfspec": {"thinking": False, **selfspec}},
        )
        entries = response.choices[0].logprobs.content
        ids = library.encode_prompt(messages, thinking=False)
        out = library.generate(ids, SamplingParams(max_tokens=12))[0].token_ids
        with torch.no_grad():
            logits = served.model(torch.tensor([ids + out])).logits[0].float()
        want = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
        assert len(entries) == len(out)
        for i, (token, entry) in enumerate(zip(out, entries)):
            assert entry.token == served.tokenizer.decode([token])
            assert entry.logprob == pytest.approx(want[i, token].item(), abs=1e-4)
            assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
                torch.topk(want[i], 3).values.tolist(), abs=1e-4
            )
    text = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, logprobs=2).choices[0]
    assert len(text.logprobs.tokens) == 6 and "".join(text.logprobs.tokens) == text.text
    assert all(len(top) == 2 for top in text.logprobs.top_logprobs)


def test_n_samples_with_a_seed_are_reproducible(client):
    def ask(stream=False):
        kwargs = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Say something."}],
            max_tokens=10,
            n=4,
            temperature=1.0,
            seed=1234,
            extra_body={"selfspec": {"thinking": False}},
        )
        if not stream:
            response = client.chat.completions.create(**kwargs)
            assert response.usage.completion_tokens == 40
            return [c.message.content for c in sorted(response.choices, key=lambda c: c.index)]
        texts = [""] * 4
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
        return texts

    first = ask()
    assert len(first) == 4 and len(set(first)) > 1
    assert ask() == first and ask(stream=True) == first


def test_penalties_equal_the_librarys(client, library):
    messages = [{"role": "user", "content": "Count from 0 to 9."}]
    penalties = dict(presence_penalty=0.6, frequency_penalty=0.4)
    got = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=24,
        extra_body={"repetition_penalty": 1.3, "selfspec": {"thinking": False, "speculation": {"method": "suffix"}}},
        **penalties,
    )
    ids = library.encode_prompt(messages, thinking=False)
    params = SamplingParams(max_tokens=24, repetition_penalty=1.3, **penalties)
    ref = library.generate(ids, params)[0]
    plain = library.generate(ids, SamplingParams(max_tokens=24))[0]
    assert got.choices[0].message.content == ref.text != plain.text


def test_json_object_regex_and_grammar_options(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "JSON please"}],
        max_tokens=80,
        response_format={"type": "json_object"},
        stream=True,
        extra_body={"selfspec": {"thinking": False}},
    )
    content, _, _, _ = _stream_message(stream)
    assert isinstance(json.loads(content), dict)
    for option, check in (
        ({"regex": "(yes|no)-[0-9]{2}"}, lambda t: t[:-3] in ("yes", "no") and t[-3] == "-" and t[-2:].isdigit()),
        ({"grammar": 'root ::= "A" | "B" "!"'}, lambda t: t in ("A", "B!")),
    ):
        text = client.completions.create(model=MODEL, prompt="Go", max_tokens=20, extra_body={"selfspec": option})
        assert check(text.choices[0].text), text.choices[0].text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"selfspec": {"regex": "("}}, "selfspec.regex"),
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ],
)  # fmt: skip
def test_bad_structured_requests_name_their_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_body=extra
        )
    assert info.value.body["param"] == param
