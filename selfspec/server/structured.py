"""Which grammar a request's answer follows: `response_format`, a forced tool call, or selfspec's
`regex` / `grammar`. The planner only describes it here (a `GrammarSpec`: cheap, no xgrammar
call); `grammar_compile` builds and compiles it off the request's thread and off the engine loop,
bounded in time and cached, since a big schema can take minutes.

A forced tool call (`tool_choice: required` or a named function) is enforced, not hoped for: the
answer is constrained to the model family's tool-call syntax with each tool's parameter schema
(xgrammar's structural tags), so even a model that never saw a tool emits a parsable call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from selfspec.server.errors import APIError
from selfspec.server.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from selfspec.server.tool_calls import family_of


@dataclass(frozen=True)
class GrammarSpec:
    """What to compile, as plain data: `kind` ("json_schema", "json_object", "regex", "ebnf",
    "tool_calls"), its `payload`, and the request `field` a failure is reported against.
    `key` is canonical (sorted JSON), so equal requests share one compile."""

    kind: str
    payload: Any
    field: str

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.payload], sort_keys=True, separators=(",", ":"))

    def build(self, grammars: Any) -> Any:
        """The xgrammar Grammar (raises `GrammarError`); `grammars` is a `GrammarCompiler`."""
        payload = self.payload
        if self.kind == "json_schema":
            return grammars.json_schema(payload["schema"], strict=payload["strict"])
        if self.kind == "json_object":
            return grammars.json_object()
        if self.kind == "regex":
            return grammars.regex(payload)
        if self.kind == "ebnf":
            return grammars.ebnf(payload)
        if self.kind == "tool_calls":
            return grammars.tool_calls(
                payload["family"], payload["tools"], payload["choice"], parallel=payload["parallel"]
            )
        raise ValueError(f"unknown grammar kind {self.kind!r}")


@dataclass
class OutputRules:
    """What constrains and parses one request's answer."""

    spec: GrammarSpec | None = None  # the grammar to compile (None: free text)
    grammar: Any = None  # the compiled grammar, once `grammar_compile` built it
    gated: bool = False  # a thinking request: the grammar starts after the end-of-thinking marker
    tool_family: str | None = None  # the parser of tool calls in the answer (None: no tools)


def _compiler(llm: Any, field: str):
    try:
        return llm.grammars
    except ImportError as exc:
        raise APIError(400, f"{exc}", param=field, code="structured_output_unavailable") from None


def tool_family(llm: Any) -> str | None:
    """The server's `--tool-call-parser` when given, else the family the chat template renders."""
    if getattr(llm, "tool_call_parser", None):
        return llm.tool_call_parser
    tokenizer = llm.tokenizer
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders tools
        template = template.get("tool_use") or template.get("default")
    return family_of(template)


def output_rules(llm: Any, body: ChatCompletionRequest | CompletionRequest) -> OutputRules:
    """The grammar to compile and the tool-call parser of this request (400 when the request
    asks for structured output this server cannot give)."""
    rules = OutputRules()
    if isinstance(body, ChatCompletionRequest) and body.uses_tools:
        rules.tool_family = tool_family(llm)
        if rules.tool_family is None:
            raise APIError(
                400, "this model's chat template renders no tool calls, so tools cannot be used", param="tools"
            )
        if body.calls_forced:
            _compiler(llm, "tool_choice")
            choice = body.tool_choice
            if isinstance(choice, NamedToolChoice):
                choice = {"type": "function", "function": {"name": choice.function.name}}
            tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
            payload = {
                "family": rules.tool_family,
                "tools": tools,
                "choice": choice,
                "parallel": body.parallel_tool_calls is not False,
            }
            rules.spec = GrammarSpec("tool_calls", payload, "tools")
    response_format = getattr(body, "response_format", None)
    # A forced tool call writes no text, so the text format has nothing to shape in this turn
    # (OpenAI accepts both: the format applies to a later turn's message, as agents send it).
    if response_format is not None and response_format.type != "text" and rules.spec is None:
        _compiler(llm, "response_format")
        if response_format.type == "json_object":
            rules.spec = GrammarSpec("json_object", None, "response_format")
        else:
            spec = response_format.json_schema
            schema = spec.schema_ if spec.schema_ is not None else {}
            payload = {"schema": schema, "strict": spec.strict is not False}
            rules.spec = GrammarSpec("json_schema", payload, "response_format")
    options = body.options
    if options.regex is not None or options.grammar is not None:
        field = "selfspec.regex" if options.regex is not None else "selfspec.grammar"
        if rules.spec is not None:
            raise APIError(400, f"{field} cannot be combined with response_format or a forced tool call", param=field)
        _compiler(llm, field)
        rules.spec = (
            GrammarSpec("regex", options.regex, field)
            if options.regex is not None
            else GrammarSpec("ebnf", options.grammar, field)
        )
    return rules
