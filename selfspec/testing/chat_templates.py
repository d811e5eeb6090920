"""Tokenizers with the Qwen3.5 and Gemma-4 chat formats, for tests of the thinking formats.

No hub access, so the templates here are written from the published formats and checked
against the renderings of the published templates, reduced to what thinking detection and
prompt building read (turn markers, special tokens, the thinking switch, the generation
prompt, how history renders):

- Qwen3.5: ChatML (`<|im_start|>`/`<|im_end|>`); `<think>`/`</think>` single tokens. The
  generation prompt opens thinking with `<think>\\n`, or holds an empty, closed block
  `<think>\\n\\n</think>\\n\\n` when thinking is off. Which one a template gives when the
  caller says nothing differs between checkpoints (the small ones think only when asked), so
  both variants are built here and selfspec always passes `enable_thinking` explicitly.
- Gemma-4: `<bos>`, turns `<|turn>{role}\\n ... <turn|>\\n` (the assistant's role is `model`);
  `enable_thinking` puts `<|think|>` (no newline after it) at the top of a system turn; the
  model reasons in `<|channel>thought\\n ... <channel|>`, and earlier turns' reasoning is not
  rendered back; with thinking off the generation prompt holds an empty, closed channel
  `<|channel>thought\\n<channel|>` (the E-series template is reported to leave it out; both
  variants are built here).

The vocabulary is the tiny byte-level BPE of `selfspec.testing.tiny` with the families'
special tokens added, so every marker is one token as in the real vocabularies.
"""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedTokenizerFast

from selfspec.testing.tiny import tiny_tokenizer

QWEN3_5_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is defined"
    " and message['reasoning_content'] -%}"
    "{{- '<think>\\n' + message['reasoning_content'].strip('\\n') + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}"
    "{{- '<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
# The small Qwen3.5 checkpoints' generation prompt: thinking only when asked for
# (`enable_thinking` true), an empty closed block otherwise, the default included.
QWEN3_5_DEFAULT_OFF_TEMPLATE = QWEN3_5_TEMPLATE.replace(
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}"
    "{{- '<think>\\n' -}}",
    "{%- if enable_thinking is defined and enable_thinking is true -%}"
    "{{- '<think>\\n' -}}"
    "{%- else -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}",
)


def _gemma4_template(empty_channel_when_off: bool) -> str:
    off = "{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"
    return (
        "{{- bos_token -}}"
        "{%- set thinking = enable_thinking is defined and enable_thinking -%}"
        "{%- if thinking or messages[0]['role'] in ['system', 'developer'] -%}"
        "{{- '<|turn>system\\n' -}}"
        "{%- if thinking -%}{{- '<|think|>' -}}{%- endif -%}"
        "{%- if messages[0]['role'] in ['system', 'developer'] -%}{{- messages[0]['content'] | trim -}}{%- endif -%}"
        "{{- '<turn|>\\n' -}}"
        "{%- endif -%}"
        "{%- for message in messages -%}"
        "{%- if message['role'] not in ['system', 'developer'] -%}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
        "{{- '<|turn>' + role + '\\n' -}}"
        "{%- set content = message['content'] -%}"
        # A model turn's own thought channel is stripped, as the published template does.
        "{%- if role == 'model' and '<|channel>' in content -%}"
        "{%- set content = content.split('<|channel>')[0] + content.split('<channel|>')[-1] -%}"
        "{%- endif -%}"
        "{{- content | trim + '<turn|>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{{- '<|turn>model\\n' -}}" + (off if empty_channel_when_off else "") + "{%- endif -%}"
    )


def family_tokenizer(
    family: Literal["qwen3_5", "qwen3_5-default-off", "gemma4", "gemma4-e"],
) -> PreTrainedTokenizerFast:
    """A tokenizer speaking `family`'s chat format.

    "qwen3_5-default-off": the small checkpoints' template, which thinks only when asked;
    "gemma4-e": the E-series generation prompt.
    """
    tokenizer = tiny_tokenizer()
    if family in ("qwen3_5", "qwen3_5-default-off"):
        tokenizer.chat_template = QWEN3_5_TEMPLATE if family == "qwen3_5" else QWEN3_5_DEFAULT_OFF_TEMPLATE
        tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>"]})
        return tokenizer
    if family not in ("gemma4", "gemma4-e"):
        raise ValueError(f"no chat format for {family!r}")
    specials = ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.bos_token = "<bos>"
    tokenizer.eos_token = "<turn|>"
    tokenizer.chat_template = _gemma4_template(empty_channel_when_off=family == "gemma4")
    return tokenizer
