"""Tool-call parsers on text in each family's real format, whole and streamed at every split."""

from __future__ import annotations

import json

import pytest

from selfspec.server.tool_calls import family_of, make_parser

# What Qwen3 writes after its reasoning (two parallel calls, text before them).
HERMES = (
    "Let me check both cities.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
# Qwen3.5 / Qwen3-Coder's XML calls.
QWEN_XML = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
# Llama 3.1's JSON call (the <|python_tag|> is a special token, hidden in the decoded text or not).
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}'

CASES = {
    "hermes": (
        HERMES,
        "Let me check both cities.\n\n",
        [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_weather", {"city": "Rome"})],
    ),
    "qwen3_xml": (QWEN_XML, "", [("get_weather", {"city": "Paris", "days": 3})]),
    "llama3_json": (LLAMA, "", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
}


@pytest.mark.parametrize("family", list(CASES))
def test_each_family_parses_its_own_format(family):
    text, content, calls = CASES[family]
    got_content, got_calls = make_parser(family).parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert all(c.id.startswith("call_") for c in got_calls)


@pytest.mark.parametrize("family", list(CASES))
def test_streaming_at_every_split_point_equals_the_whole_parse(family):
    text, content, calls = CASES[family]
    for cut in range(1, len(text)):
        parser = make_parser(family)
        shown, got = parser.feed(text[:cut])
        more, late = parser.feed(text[cut:])
        rest, last = parser.close()
        assert shown + more + rest == content, cut
        assert [(c.name, json.loads(c.arguments)) for c in got + late + last] == calls, cut


def test_plain_answers_and_broken_calls_stay_text():
    assert make_parser("hermes").parse("The answer is 42.") == ("The answer is 42.", [])
    assert make_parser("llama3_json").parse("The answer is {42}.") == ("The answer is {42}.", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert make_parser("hermes").parse(broken) == (broken, [])
    # An unterminated call at the end (max_tokens) still parses when its JSON is whole.
    content, calls = make_parser("hermes").parse('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_c')
    assert content == "" and [c.name for c in calls] == ["f"]


def test_the_family_comes_from_the_chat_template():
    assert family_of("{{- '<tool_call>\\n' + tool_call.name }}") == "hermes"
    assert family_of("<tool_call>\\n<function={{ name }}>") == "qwen3_xml"
    assert family_of('{{- "<|python_tag|>" }}{"name": ..., "parameters": ...} {% if tools %}') == "llama3_json"
    assert family_of("{{ messages }}") is None and family_of(None) is None
    with pytest.raises(ValueError, match="unknown tool-call format"):
        make_parser("mistral")
