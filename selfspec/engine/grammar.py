"""Grammars for constrained decoding, compiled by xgrammar (the `[structured]` extra).

Why xgrammar: of the three well-kept engines that install from PyPI here (xgrammar, llguidance,
outlines-core), it computed the next-token mask fastest — on SmolLM2's 49k vocabulary a median
of ~6 µs per token against ~28 µs (llguidance) and ~110 µs (outlines-core), see
`benchmarks/structured_output/` — and its matcher rolls back accepted tokens, which speculative
verification needs. It also knows the tool-call formats of the model families served here
(`get_model_structural_tag`), so `tool_choice: required` or a named function is enforced by the
same grammar machinery as `response_format`.

`GrammarCompiler` is one per tokenizer (building its token table costs ~0.3 s on 49k tokens);
compiled grammars are cached by xgrammar, and each sequence gets its own `XGrammarState`.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import torch

from selfspec.engine.constraint import SequenceConstraint

INSTALL_HINT = "structured output needs xgrammar: pip install 'selfspec[structured]'"

# Tool-call formats xgrammar knows, by our parser family names (`selfspec.server.tool_calls`).
STRUCTURAL_TAG_MODELS = {"hermes": "qwen_3", "qwen3_xml": "qwen_3_5", "llama3_json": "llama"}
CALL_SEPARATORS = {"hermes": "\n", "qwen3_xml": "\n", "llama3_json": "; "}


class GrammarError(ValueError):
    """A schema, regex or grammar that does not compile; the message says why."""


def _xgrammar():
    try:
        import xgrammar
    except ImportError as exc:  # pragma: no cover - the extra is part of [server] and [dev]
        raise ImportError(INSTALL_HINT) from exc
    return xgrammar


class XGrammarState:
    """An xgrammar matcher with its own bitmask buffer; `allowed()` unpacks it to bools."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        xgr = _xgrammar()
        self._matcher = matcher
        self.vocab_size = vocab_size
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        self._matcher.fill_next_token_bitmask(self._bitmask)
        bits = (self._bitmask[0].unsqueeze(-1) >> self._shifts) & 1
        return bits.reshape(-1)[: self.vocab_size].bool()

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(int(token)))

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    def fork(self) -> "XGrammarState":
        return XGrammarState(self._matcher.fork(), self.vocab_size)


COMPILE_CACHE_BYTES = 256 << 20
"""xgrammar's compile cache per tokenizer: repeated schemas compile once, memory stays bounded."""


class GrammarCompiler:
    """Compiles request grammars for one tokenizer and vocabulary (the model's logits width)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        xgr = _xgrammar()
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(int(t) for t in stop_token_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=self.stop_token_ids)
        # Bounded: a server sees many distinct schemas over its life, and xgrammar's own cache
        # (unbounded by default) would keep every compiled grammar (masks included) forever.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_limit_bytes=COMPILE_CACHE_BYTES)

    # ------------------------------------------------------------------ grammars by kind
    def json_schema(self, schema: dict | str, *, strict: bool = True) -> Any:
        """A JSON document valid under `schema`. Whitespace between tokens is a single space at
        most (`any_whitespace=False`): small models otherwise run away in whitespace loops."""
        xgr = _xgrammar()
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            return xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=strict)
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses
            raise GrammarError(f"the JSON schema does not compile: {exc}") from None

    def json_object(self) -> Any:
        """Any JSON object (`response_format: json_object`)."""
        return self.json_schema({"type": "object"}, strict=False)

    def regex(self, pattern: str) -> Any:
        xgr = _xgrammar()
        try:
            return xgr.Grammar.from_regex(pattern)
        except Exception as exc:  # noqa: BLE001
            raise GrammarError(f"the regex does not compile: {exc}") from None

    def ebnf(self, grammar: str) -> Any:
        xgr = _xgrammar()
        try:
            return xgr.Grammar.from_ebnf(grammar)
        except Exception as exc:  # noqa: BLE001
            raise GrammarError(f"the grammar does not compile: {exc}") from None

    def tool_calls(self, family: str, tools: list[dict], tool_choice: Any, *, parallel: bool = True) -> Any:
        """The model family's tool-call syntax with `tools`' argument schemas, as `tool_choice`
        demands ("required": one or more calls and nothing else, one with `parallel` False; a named
        function: exactly one call of it)."""
        xgr = _xgrammar()
        model = STRUCTURAL_TAG_MODELS.get(family)
        if model is None:
            raise GrammarError(f"no tool-call grammar for the {family!r} format")
        from xgrammar.structural_tag import StructuralTag, TagsWithSeparatorFormat, TriggeredTagsFormat

        try:
            tag = xgr.get_model_structural_tag(
                model,
                tools=tools,
                tool_choice=tool_choice,
                reasoning="disabled",
                parallel_tool_calls=parallel,
                max_whitespace_cnt=1,  # as for JSON schemas: no whitespace loops in the arguments
            )
            if tool_choice == "required" and isinstance(tag.format, TriggeredTagsFormat):
                # xgrammar's "required" still allows free text around the calls; a forced answer is
                # the calls alone, then the end of the turn.
                calls = TagsWithSeparatorFormat(
                    tags=tag.format.tags,
                    separator=CALL_SEPARATORS[family],
                    at_least_one=True,
                    stop_after_first=not parallel,
                )
                tag = StructuralTag(format=calls)
            return xgr.Grammar.from_structural_tag(tag)
        except Exception as exc:  # noqa: BLE001
            raise GrammarError(f"the tools do not compile to a tool-call grammar: {exc}") from None

    # ------------------------------------------------------------------ per sequence
    def compile(self, grammar: Any, *, gated: bool = False) -> Any:
        """The compiled grammar a constraint matches (slow for big schemas: the server calls this
        in its planner thread, not on the engine's). `gated`: for a thinking request, whose answer
        starts after the end-of-thinking marker; up to 8 whitespace characters may then lead, as
        templates put a blank line after the marker (bounded: a small model could otherwise loop
        on newlines)."""
        xgr = _xgrammar()
        if isinstance(grammar, xgr.CompiledGrammar):
            return grammar
        if gated:
            grammar = xgr.Grammar.concat(xgr.Grammar.from_ebnf("root ::= [ \\t\\n]{0,8}"), grammar)
        try:
            return self._compiler.compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001
            raise GrammarError(f"the grammar does not compile: {exc}") from None

    def constraint(self, grammar: Any, *, start: int, open_after: Sequence[Sequence[int]] = ()) -> SequenceConstraint:
        """A sequence's constraint over `grammar` (a Grammar, or one `compile`d with the same
        gating). Behind a gate (`open_after`, the end of thinking) the stop tokens are masked until
        it opens."""
        xgr = _xgrammar()
        compiled = self.compile(grammar, gated=bool(open_after))
        state = XGrammarState(xgr.GrammarMatcher(compiled), self.vocab_size)
        return SequenceConstraint(state, start, open_after, closed_forbids=self.stop_token_ids)
