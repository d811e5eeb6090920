"""Request bodies of the OpenAI-compatible endpoints, validated strictly.

Every client mistake must come back as a 4xx that names the field, never a 500, so
bodies are parsed by pydantic in strict mode (a string is not a number, 1.0 is not an
int, NaN and infinities are rejected) with unknown fields forbidden (a typo such as
`max_token` is reported instead of silently ignored). OpenAI fields that selfspec does
not implement are accepted only at their no-op values (`logit_bias: {}`, `echo: false`, ...),
so a client that sends its defaults works and one that relies on a feature learns that
it is missing (docs/server.md lists every field).

selfspec's own options live in a `selfspec` object (the openai client sends it through
`extra_body`); the same keys are also accepted at the top level of the body.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from selfspec.config import BaselineSpecConfig
from selfspec.spec.ssr import SSRConfig

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_TIMEOUT_S = 24 * 3600.0
MAX_N = 16
MAX_TOP_LOGPROBS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class _Lenient(BaseModel):
    """For nested objects whose extra keys some clients echo back (ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class RefusalPart(_Lenient):
    """An assistant turn's refusal, as the openai client echoes a refused reply back into the
    history; rendered as that turn's text (only assistant messages may hold one)."""

    type: Literal["refusal"]
    refusal: str


ContentPart = Union[TextPart, RefusalPart]


class FunctionCall(_Lenient):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def as_template_message(self) -> dict[str, Any]:
        """The dict the chat template reads (content parts joined to one string; a tool call's
        arguments as an object, which templates render with `tojson`, as vLLM hands them over)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text if isinstance(part, TextPart) else part.refusal for part in content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            message["name"] = self.name
        if self.reasoning_content:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _as_object(c.function.arguments)},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _as_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionDefinition(_Lenient):
    """A function tool. Missing or empty `parameters` mean a function without parameters, as
    OpenAI reads them: the arguments are the empty object `{}` (the JSON schema `{}` would allow
    any JSON value, arrays and endless numbers included, and a forced call would never end)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, validate_default=True)
    strict: bool | None = None

    @field_validator("parameters", mode="after")
    @classmethod
    def _empty_is_no_parameters(cls, value: dict[str, Any] | None) -> dict[str, Any]:
        return dict(EMPTY_PARAMETERS, properties={}) if not value else value


class ToolDefinition(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    """`include_obfuscation` is accepted and ignored: OpenAI pads chunks against side channels on
    its network; a local server sends none of that padding."""

    include_usage: bool = False
    include_obfuscation: bool | None = None


class JSONSchemaFormat(_Lenient):
    name: str = Field(min_length=1, max_length=64)  # required, as OpenAI requires it
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """`text`, `json_object` (any JSON object) or `json_schema` (a document valid under the schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        return self


class CoSpecOptions(_Strict):
    """Opt in to CoSpec (LOSSY: the arbitrator may keep draft tokens the target would not
    have chosen; the response says `usage.selfspec.lossy: true`). Needs a server started
    with an arbitrator and greedy decoding; unset fields take the server's defaults.

    threshold: keep the draft token at a mismatch iff π(keep) >= threshold; 1 never keeps.
    num_speculative_tokens: draft tokens per round (K).
    """

    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)


class SelfspecOptions(_Strict):
    """selfspec's per-request options.

    ssr: SSR settings (merged over the server's defaults); `true` uses the defaults,
      `false` turns SSR off for this request.
    speculation: suffix decoding / prompt lookup instead of SSR (same merging rules).
    cospec: CoSpec with the server's arbitrator (lossy; `true` uses the server's defaults).
    thinking: let the model think first (default: the model's own default).
    cot_cap / answer_cap / fixed_length: the thinking length rules (`ThinkingLimits`).
    timeout_s: give up after this many seconds (at most the server's timeout).
    regex / grammar: constrain the answer to a regular expression or an EBNF grammar (xgrammar's
      dialect), like `response_format` does to JSON.
    """

    ssr: Union[SSRConfig, bool, None] = Field(default=None, union_mode="left_to_right")
    speculation: Union[BaselineSpecConfig, bool, None] = Field(default=None, union_mode="left_to_right")
    cospec: Union[CoSpecOptions, bool, None] = Field(default=None, union_mode="left_to_right")
    thinking: bool | None = None
    cot_cap: int | None = Field(default=None, ge=1)
    answer_cap: int | None = Field(default=None, ge=1)
    fixed_length: bool | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    regex: str | None = Field(default=None, min_length=1, max_length=16384)
    grammar: str | None = Field(default=None, min_length=1, max_length=65536)

    @model_validator(mode="after")
    def _one_speculation_source(self) -> "SelfspecOptions":
        if _is_on(self.ssr) and _is_on(self.speculation):
            raise ValueError("give either ssr or speculation, not both")
        if _is_on(self.cospec) and (_is_on(self.ssr) or _is_on(self.speculation)):
            raise ValueError("cospec is a speculation mode of its own; give it without ssr or speculation")
        if self.regex is not None and self.grammar is not None:
            raise ValueError("give either regex or grammar, not both")
        return self


def _is_on(value: Any) -> bool:
    return value is not None and value is not False


_SELFSPEC_KEYS = tuple(SelfspecOptions.model_fields)


def _lift_selfspec_keys(data: Any) -> Any:
    """Move top-level selfspec keys (`ssr`, `cot_cap`, ...) into the `selfspec` object."""
    if not isinstance(data, dict):
        return data
    lifted = {key: data[key] for key in _SELFSPEC_KEYS if key in data}
    if not lifted:
        return data
    rest = {key: value for key, value in data.items() if key not in lifted}
    nested = rest.get("selfspec")
    if nested is None:
        nested = {}
    if not isinstance(nested, dict):
        return data  # let validation report `selfspec` itself
    clash = sorted(set(lifted) & set(nested))
    if clash:
        raise ValueError(f"{', '.join(clash)} given both at the top level and inside `selfspec`")
    rest["selfspec"] = {**nested, **lifted}
    return rest


class _CommonRequest(_Strict):
    """Fields shared by chat and text completions."""

    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    n: int | None = Field(default=1, ge=1, le=MAX_N)  # null: the default, as OpenAI reads it
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] | None = None
    stream: bool | None = False  # null: the default
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # Not implemented: accepted at its no-op value only.
    logit_bias: dict[str, float] | None = None
    selfspec: SelfspecOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _lift(cls, data: Any) -> Any:
        return _lift_selfspec_keys(data)

    @field_validator("n", "stream")
    @classmethod
    def _null_is_default(cls, value: Any, info: Any) -> Any:
        """OpenAI's clients and SDKs send `null` for an option left unset."""
        if value is None:
            return 1 if info.field_name == "n" else False
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        for s in stops:
            if not s:
                raise ValueError("stop strings must not be empty")
            if len(s) > MAX_STOP_LENGTH:
                raise ValueError(f"stop strings must be at most {MAX_STOP_LENGTH} characters")
        return stops

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if len(value) > 1024:
                raise ValueError("at most 1024 stop token ids")
            if any(t < 0 for t in value):
                raise ValueError("token ids must be >= 0")
        return value

    @model_validator(mode="after")
    def _check_unsupported(self) -> "_CommonRequest":
        if self.logit_bias:
            raise UnsupportedField("logit_bias", "logit_bias is not supported by selfspec")
        if self.min_tokens and self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise UnsupportedField("min_tokens", "min_tokens must not exceed max_tokens")
        return self

    @property
    def options(self) -> SelfspecOptions:
        return self.selfspec or SelfspecOptions()


class UnsupportedField(ValueError):
    """A field that is valid OpenAI but not implemented here, or inconsistent with another."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class ChatCompletionRequest(_CommonRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=128)
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = Field(
        default=None, union_mode="left_to_right"
    )
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> "ChatCompletionRequest":
        _check_messages(self.messages)
        names = [tool.function.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise UnsupportedField("tools", "tool names must be unique")
        choice = self.tool_choice
        if choice == "required" and not names:
            raise UnsupportedField("tool_choice", "tool_choice required needs tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise UnsupportedField("tool_choice", f"tool_choice names {choice.function.name!r}, which is not in tools")
        if self.top_logprobs is not None and not self.logprobs:
            raise UnsupportedField("top_logprobs", "top_logprobs needs logprobs: true")
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise UnsupportedField("max_completion_tokens", "max_tokens and max_completion_tokens disagree")
        kwargs = self.chat_template_kwargs or {}
        unknown = sorted(set(kwargs) - {"enable_thinking"})
        if unknown:
            raise UnsupportedField(
                "chat_template_kwargs", f"unsupported chat_template_kwargs: {unknown} (only enable_thinking)"
            )
        if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
            raise UnsupportedField("chat_template_kwargs.enable_thinking", "enable_thinking must be a boolean")
        return self

    @property
    def completion_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def requested_thinking(self) -> bool | None:
        """`selfspec.thinking`, else vLLM's `chat_template_kwargs.enable_thinking`."""
        if self.options.thinking is not None:
            return self.options.thinking
        kwargs = self.chat_template_kwargs or {}
        return kwargs.get("enable_thinking")

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_message() for m in self.messages]

    @property
    def uses_tools(self) -> bool:
        """Tools are rendered into the prompt and calls parsed from the answer (not with `none`)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def calls_forced(self) -> bool:
        """`required` or a named function: the answer is constrained to tool calls."""
        return self.uses_tools and (self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice))

    @property
    def logprobs_count(self) -> int | None:
        """Alternatives per token for the engine (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


def _check_messages(messages: list[ChatMessage]) -> None:
    """What OpenAI refuses in a conversation: a tool result that names no call, a call whose
    arguments are not JSON text, a refusal part outside an assistant turn."""
    for i, message in enumerate(messages):
        if message.role == "tool" and not message.tool_call_id:
            raise UnsupportedField(f"messages.{i}.tool_call_id", "a message with role tool needs a tool_call_id")
        if isinstance(message.content, list) and message.role != "assistant":
            for j, part in enumerate(message.content):
                if isinstance(part, RefusalPart):
                    raise UnsupportedField(
                        f"messages.{i}.content.{j}", "refusal content parts belong to assistant messages only"
                    )
        for j, call in enumerate(message.tool_calls or []):
            try:
                json.loads(call.function.arguments)
            except json.JSONDecodeError as exc:
                raise UnsupportedField(
                    f"messages.{i}.tool_calls.{j}.function.arguments",
                    f"the arguments of a tool call must be JSON text ({exc.msg} at character {exc.pos})",
                ) from None


class CompletionRequest(_CommonRequest):
    prompt: Union[str, list[int], list[str], list[list[int]]] = Field(union_mode="left_to_right")
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check_completion(self) -> "CompletionRequest":
        if self.echo:
            raise UnsupportedField("echo", "echo is not supported by selfspec")
        if self.best_of not in (None, 1):
            raise UnsupportedField("best_of", "only best_of=1 is supported")
        if self.suffix:
            raise UnsupportedField("suffix", "suffix is not supported by selfspec")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise UnsupportedField("prompt", "one prompt per request (got a batch of several)")
        return self

    @property
    def completion_limit(self) -> int | None:
        return self.max_tokens

    @property
    def logprobs_count(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            return prompt[0]  # a batch of one
        return prompt
