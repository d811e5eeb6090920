"""Which grammar a request's answer follows: `response_format`, a forced tool call, or selfspec's
`regex` / `grammar`; compiled here, in the planner's worker thread, so a bad schema is a 400
naming its field before the request reaches the engine.

A forced tool call (`tool_choice: required` or a named function) is enforced, not hoped for: the
answer is constrained to the model family's tool-call syntax with each tool's parameter schema
(xgrammar's structural tags), so even a model that never saw a tool emits a parsable call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from selfspec.server.errors import APIError
from selfspec.server.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from selfspec.server.tool_calls import family_of


@dataclass
class OutputRules:
    """What constrains and parses one request's answer."""

    grammar: Any = None  # an xgrammar Grammar (None: free text)
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
    """The grammar and the tool-call parser of this request (400 when they cannot be built)."""
    from selfspec.engine.grammar import GrammarError

    rules = OutputRules()
    field = None
    try:
        if isinstance(body, ChatCompletionRequest) and body.uses_tools:
            field = "tools"
            rules.tool_family = tool_family(llm)
            if rules.tool_family is None:
                raise APIError(
                    400, "this model's chat template renders no tool calls, so tools cannot be used", param="tools"
                )
            if body.calls_forced:
                field = "tool_choice"
                choice = body.tool_choice
                if isinstance(choice, NamedToolChoice):
                    choice = {"type": "function", "function": {"name": choice.function.name}}
                tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
                parallel = body.parallel_tool_calls is not False
                rules.grammar = _compiler(llm, field).tool_calls(rules.tool_family, tools, choice, parallel=parallel)
        response_format = getattr(body, "response_format", None)
        if response_format is not None and response_format.type != "text":
            field = "response_format"
            grammars = _compiler(llm, field)
            if response_format.type == "json_object":
                rules.grammar = grammars.json_object()
            else:
                spec = response_format.json_schema
                schema = spec.schema_ if spec.schema_ is not None else {}
                rules.grammar = grammars.json_schema(schema, strict=spec.strict is not False)
        options = body.options
        if options.regex is not None or options.grammar is not None:
            field = "selfspec.regex" if options.regex is not None else "selfspec.grammar"
            if rules.grammar is not None:
                raise APIError(
                    400, f"{field} cannot be combined with response_format or a forced tool call", param=field
                )
            grammars = _compiler(llm, field)
            rules.grammar = (
                grammars.regex(options.regex) if options.regex is not None else grammars.ebnf(options.grammar)
            )
    except GrammarError as exc:
        raise APIError(400, str(exc), param=field, code="invalid_grammar") from None
    return rules
