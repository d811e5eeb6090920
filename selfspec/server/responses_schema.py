"""Request bodies of the Responses API (`POST /v1/responses`), validated as strictly as chat's.

The same rules as `schemas.py`: pydantic in strict mode, unknown fields refused with a 400 that
names them, OpenAI fields selfspec does not implement accepted only at their no-op values. The
input is a string or a list of items: messages (with or without `"type": "message"`, as the
openai client and the Agents SDK send them), `function_call` and `function_call_output` items,
and `reasoning` items a client hands back. Items of other kinds (images, files, hosted tools,
item references) are refused naming the item's `type`, never dropped.

selfspec's options live in a `selfspec` object (or as top-level keys), as for chat completions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, model_validator

from selfspec.server.schemas import (
    MAX_TOP_LOGPROBS,
    SelfspecOptions,
    UnsupportedField,
    _Lenient,
    _lift_selfspec_keys,
    _Strict,
)

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TOOL_TYPES = ("function",)
# What `include` may ask for: encrypted reasoning is a no-op here (reasoning items come back in clear).
INCLUDABLE = ("reasoning.encrypted_content",)


class ContentPart(_Lenient):
    """Text content of a message: `input_text` (user turns) or `output_text` (assistant turns
    handed back; their `annotations` and `logprobs` are ignored)."""

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[ContentPart]]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Union[str, list[ContentPart]]

    @property
    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class ReasoningText(_Lenient):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Lenient):
    """A reasoning item the client hands back: rendered as the next assistant turn's reasoning."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None

    @property
    def text(self) -> str:
        """The chain of thought: the raw reasoning text when given, else the summary."""
        parts = self.content or self.summary
        return "\n\n".join(part.text for part in parts)


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return {
        "message": "Message",
        "function_call": "FunctionCall",
        "function_call_output": "FunctionCallOutput",
        "reasoning": "Reasoning",
    }.get(kind, "Unknown")


# Tags are capitalized so that error paths read `input.2.content`, without the member's name.
InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("Message")],
        Annotated[FunctionCallItem, Tag("FunctionCall")],
        Annotated[FunctionCallOutputItem, Tag("FunctionCallOutput")],
        Annotated[ReasoningItem, Tag("Reasoning")],
    ],
    Discriminator(_item_kind),
]


class FunctionTool(_Lenient):
    """A Responses-style function tool: flat, not nested under `function` as in chat."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(_Lenient):
    type: Literal["function"]
    name: str


class TextFormat(_Lenient):
    """`text.format`: `text`, `json_object` or `json_schema` (flat: name, schema, strict)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a json_schema format needs a schema")
        return self


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # not supported: refused, as chat refuses it

    @model_validator(mode="after")
    def _no_verbosity(self) -> "TextConfig":
        if self.verbosity is not None:
            raise UnsupportedField("text.verbosity", "text.verbosity is not supported")
        return self


class ReasoningConfig(_Strict):
    """Accepted; `effort: "none"` turns thinking off, any other effort keeps the model's default."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None  # padding against length side channels: nothing to pad here


class ResponsesRequest(_Strict):
    model: str = Field(min_length=1, max_length=512)
    input: Union[str, list[InputItem]] = Field(union_mode="left_to_right")
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Union[Literal["none", "auto", "required"], NamedFunctionChoice, None] = Field(
        default=None, union_mode="left_to_right"
    )
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = Field(default=None, min_length=1)
    store: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    # Not implemented: accepted at their no-op values only.
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    background: bool | None = None
    max_tool_calls: int | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    conversation: Any = None
    prompt: Any = None
    selfspec: SelfspecOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _lift_and_check_kinds(cls, data: Any) -> Any:
        data = _lift_selfspec_keys(data)
        if not isinstance(data, dict):
            return data
        items = data.get("input")
        if isinstance(items, list):
            for i, item in enumerate(items):
                kind = item.get("type", "message") if isinstance(item, dict) else None
                if isinstance(kind, str) and kind not in ITEM_TYPES:
                    raise UnsupportedField(
                        f"input.{i}.type", f"input items of type {kind!r} are not supported (only {ITEM_TYPES})"
                    )
        tools = data.get("tools")
        if isinstance(tools, list):
            for i, tool in enumerate(tools):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if isinstance(kind, str) and kind not in TOOL_TYPES:
                    raise UnsupportedField(
                        f"tools.{i}.type", f"tools of type {kind!r} are not supported (only function tools)"
                    )
        return data

    @model_validator(mode="after")
    def _check(self) -> "ResponsesRequest":
        names = [tool.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise UnsupportedField("tools", "tool names must be unique")
        if isinstance(self.tool_choice, NamedFunctionChoice) and self.tool_choice.name not in names:
            raise UnsupportedField("tool_choice", f"tool_choice names {self.tool_choice.name!r}, which is not in tools")
        if self.tool_choice == "required" and not names:
            raise UnsupportedField("tool_choice", "tool_choice required needs tools")
        if isinstance(self.input, str) and not self.input.strip() and self.previous_response_id is None:
            raise UnsupportedField("input", "input is empty")
        refused = (
            ("truncation", self.truncation == "auto", "truncation auto is not supported: a prompt longer than "
             "the context is refused (400) instead of cut"),
            ("top_logprobs", bool(self.top_logprobs), "top_logprobs is not supported on /v1/responses"),
            ("background", bool(self.background), "background responses are not supported"),
            ("max_tool_calls", self.max_tool_calls is not None, "max_tool_calls is not supported"),
            ("prompt_cache_key", self.prompt_cache_key is not None, "prompt_cache_key is not supported"),
            ("safety_identifier", self.safety_identifier is not None, "safety_identifier is not supported"),
            ("conversation", self.conversation is not None, "conversations are not supported: "
             "use previous_response_id"),
            ("prompt", self.prompt is not None, "stored prompt templates are not supported"),
        )  # fmt: skip
        for field, wanted, message in refused:
            if wanted:
                raise UnsupportedField(field, message)
        for i, entry in enumerate(self.include or []):
            if entry not in INCLUDABLE:
                raise UnsupportedField(f"include.{i}", f"include {entry!r} is not supported (only {INCLUDABLE})")
        return self

    @property
    def options(self) -> SelfspecOptions:
        return self.selfspec or SelfspecOptions()

    @property
    def stores(self) -> bool:
        """OpenAI's default: responses are stored unless `store: false`."""
        return self.store is not False

    @property
    def items(self) -> list[Any]:
        """The input as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)] if self.input else []
        return list(self.input)
