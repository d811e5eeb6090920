"""`--chat-template`, `--tool-call-parser`, `--reasoning-parser`: how the server renders and reads chat.

Why: a model's own chat template decides whether it can use tools at all (SmolLM2's renders
none, so every `tools` request would be refused) and which thinking markers split reasoning
from the answer. These flags, named and read as vLLM's are, let an operator give any model a
template and say which tool-call and reasoning format its output follows:

* `--chat-template`: a file, a packaged name (`PACKAGED_TEMPLATES`, files under `templates/`),
  or the template text itself (vLLM's rule: a value with a Jinja delimiter or a newline is a
  template, anything else a path). It replaces the tokenizer's template, so prompt building,
  thinking detection and tool-call family detection all read the new one.
* `--tool-call-parser`: the tool-call family (`tool_calls.FAMILIES`), over the one detected
  from the template.
* `--reasoning-parser`: `deepseek_r1` and `qwen3` both mean `<think>`/`</think>`, emitted by the
  model itself (a native thinking format); whether the generation prompt already opens the
  block is read from the template, which is what tells vLLM's two parsers apart.

Everything is checked before the model loads (`ValueError` naming the flag) and applied after.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selfspec.server.tool_calls import FAMILIES

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
PACKAGED_TEMPLATES = {"smollm2-tools": "smollm2_tools.jinja"}
"""Templates shipped with the package, by the name `--chat-template` takes."""

TOOL_CALL_PARSERS = {
    "hermes": "hermes",
    "qwen3_xml": "qwen3_xml",
    "qwen3_coder": "qwen3_xml",
    "llama3_json": "llama3_json",
}
"""vLLM's `--tool-call-parser` names and the family (`tool_calls.FAMILIES`) each parses."""

REASONING_PARSERS = {"deepseek_r1": ("<think>", "</think>"), "qwen3": ("<think>", "</think>")}
"""vLLM's `--reasoning-parser` names and the (start, end) thinking markers each reads."""

assert set(TOOL_CALL_PARSERS.values()) <= set(FAMILIES)


@dataclass(frozen=True)
class ChatSettings:
    """What the three flags asked for, checked: the template text and the two parsers' meanings."""

    template: str | None = None
    tool_family: str | None = None
    reasoning_markers: tuple[str, str] | None = None

    @property
    def changes_thinking(self) -> bool:
        return self.template is not None or self.reasoning_markers is not None


def _looks_like_template(value: str) -> bool:
    return any(mark in value for mark in ("{{", "{%", "{#", "\n"))


def read_chat_template(value: str) -> str:
    """The template text `--chat-template value` names; ValueError saying what is wrong."""
    if value in PACKAGED_TEMPLATES:
        return (TEMPLATE_DIR / PACKAGED_TEMPLATES[value]).read_text(encoding="utf-8")
    path = Path(value).expanduser()
    if not _looks_like_template(value):
        if path.is_file():
            try:
                return path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--chat-template {value!r}: cannot read it: {exc}") from None
        raise ValueError(
            f"--chat-template {value!r}: no such file, and not a packaged template "
            f"({', '.join(PACKAGED_TEMPLATES)}) or a Jinja template"
        )
    return value


def check_template(text: str, flag_value: str) -> None:
    """Compile `text` as transformers does (sandboxed Jinja); ValueError with the line at fault."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if not text.strip():
        raise ValueError(f"--chat-template {flag_value!r}: the template is empty")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    try:
        env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        shown = flag_value if len(flag_value) <= 60 else flag_value[:57] + "..."
        raise ValueError(f"--chat-template {shown!r}: not a valid Jinja template (line {exc.lineno}: {exc.message})")


def _choice(flag: str, name: str, choices: dict[str, Any]) -> Any:
    if name not in choices:
        raise ValueError(f"{flag} {name!r}: choose from {', '.join(choices)}")
    return choices[name]


def check_chat_flags(
    chat_template: str | None, tool_call_parser: str | None, reasoning_parser: str | None
) -> ChatSettings:
    """The flags' settings, checked before any model loads; ValueError names the flag."""
    template = None
    if chat_template is not None:
        template = read_chat_template(chat_template)
        check_template(template, chat_template)
    family = _choice("--tool-call-parser", tool_call_parser, TOOL_CALL_PARSERS) if tool_call_parser else None
    markers = _choice("--reasoning-parser", reasoning_parser, REASONING_PARSERS) if reasoning_parser else None
    return ChatSettings(template=template, tool_family=family, reasoning_markers=markers)


def apply_chat_settings(served: Any, settings: ChatSettings) -> None:
    """Put the template on `served`'s tokenizer and detect its thinking format again.

    `served` is an `LLM` or a backend (anything with `tokenizer` and `thinking_format`; the vLLM
    backend's engine keeps its own `thinking_format`, set too). Without a reasoning parser a
    packaged model's own marker overrides (`ModelEntry.thinking_start/end`) still hold.
    """
    from selfspec.models.registry import get_model_entry
    from selfspec.thinking.format import ThinkingFormat

    if not settings.changes_thinking:
        return
    tokenizer = served.tokenizer
    if settings.template is not None:
        tokenizer.chat_template = settings.template
    kind = None
    if settings.reasoning_markers is not None:
        (start, end), kind = settings.reasoning_markers, "native"
    else:
        entry = get_model_entry(getattr(served, "model_name", "") or "")
        start, end = (entry.thinking_start, entry.thinking_end) if entry is not None else (None, None)
    fmt = ThinkingFormat.detect(tokenizer, start, end, kind=kind)
    served.thinking_format = fmt
    engine = getattr(served, "engine", None)
    if engine is not None and hasattr(engine, "thinking_format"):
        engine.thinking_format = fmt
