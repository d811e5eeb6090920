"""Thinking formats of the paper's families, read from tokenizers with their chat formats.

Qwen3.5: `<think>`/`</think>`, the generation prompt opens thinking. Gemma-4: the thought
channel `<|channel>thought\\n ... <channel|>`, switched on by `<|think|>` in a system turn.
"""

from __future__ import annotations

import pytest

from selfspec.testing.chat_templates import family_tokenizer
from selfspec.thinking.format import EndOfThinkingMatcher, ThinkingFormat, build_prompt_text, split_reasoning


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5-default-off"])
def test_qwen3_5_opens_thinking_in_its_generation_prompt(family):
    tok = family_tokenizer(family)
    fmt = ThinkingFormat.detect(tok)
    assert fmt.kind == "native" and fmt.template_opens_thinking and fmt.template_takes_enable_thinking
    assert (fmt.start_marker, fmt.end_marker) == ("<think>", "</think>")
    assert len(fmt.start_ids) == 1 and len(fmt.end_ids) == 1
    on, _ = build_prompt_text(tok, "Hi", fmt, enable_thinking=True)
    off, _ = build_prompt_text(tok, "Hi", fmt, enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # The model's output starts inside thinking; the end marker splits reasoning from answer.
    out = _ids(tok, "Let me add.\n</think>\n\nThe answer is 42.")
    reasoning, answer = split_reasoning(out, fmt)
    assert tok.decode(reasoning).strip() == "Let me add."
    assert tok.decode(answer).strip() == "The answer is 42."
    assert tok.decode(list(fmt.close_ids)) == "\n</think>\n\n"


@pytest.mark.parametrize("family", ["gemma4", "gemma4-e"])
def test_gemma4_thinks_in_its_thought_channel(family):
    tok = family_tokenizer(family)
    fmt = ThinkingFormat.detect(tok)
    assert fmt.kind == "native" and fmt.template_takes_enable_thinking and not fmt.template_opens_thinking
    assert (fmt.start_marker, fmt.end_marker) == ("<|channel>thought\n", "<channel|>")
    assert fmt.end_ids == tuple(_ids(tok, "<channel|>")) and len(fmt.end_ids) == 1
    assert fmt.close_ids == fmt.end_ids
    on, _ = build_prompt_text(tok, "Hi", fmt, enable_thinking=True)
    assert on == "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    off, _ = build_prompt_text(tok, "Hi", fmt, enable_thinking=False)
    tail = "<|turn>model\n<|channel>thought\n<channel|>" if family == "gemma4" else "<|turn>model\n"
    assert off.endswith(tail) and "<|think|>" not in off
    # The model opens the channel itself; the split drops it and the close marker.
    out = _ids(tok, "<|channel>thought\nAdd 12 and 30.<channel|>The answer is 42.<turn|>")
    reasoning, answer = split_reasoning(out, fmt)
    assert tok.decode(reasoning) == "Add 12 and 30."
    assert tok.decode(answer) == "The answer is 42.<turn|>"
    matcher = EndOfThinkingMatcher(fmt)
    assert matcher.feed_many(out) == out.index(fmt.end_ids[0])


def test_gemma4_system_prompt_and_history_render_with_the_switch():
    tok = family_tokenizer("gemma4")
    fmt = ThinkingFormat.detect(tok)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<|channel>thought\nsum<channel|>4", "reasoning_content": "two and two"},
        {"role": "user", "content": "3+3?"},
    ]
    text, raw = build_prompt_text(tok, messages, fmt, enable_thinking=True)
    assert not raw
    assert text.startswith("<bos><|turn>system\n<|think|>Be brief.<turn|>\n")
    # Earlier turns' reasoning is not rendered back into the prompt.
    assert "<|turn>model\n4<turn|>\n" in text and "two and two" not in text and "sum" not in text
    assert text.endswith("<|turn>user\n3+3?<turn|>\n<|turn>model\n")


def test_explicit_markers_override_the_family_style():
    tok = family_tokenizer("gemma4")
    fmt = ThinkingFormat.detect(tok, "<think>", "</think>")
    assert (fmt.start_marker, fmt.end_marker) == ("<think>", "</think>")
