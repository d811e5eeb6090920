"""One choice of a response as the client sees it: reasoning, content, tool calls and logprobs.

A request with `n` samples has `n` choices. Each turns its growing output ids into text through a
`ResponseText` (reasoning split off, stop strings cut), then, when the request uses tools, feeds
its content through the model family's tool-call parser, and formats the tokens' logprobs in the
endpoint's shape. Streaming and non-streaming responses share it, so a stream's deltas add up to
the non-streamed choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from selfspec.engine.logits_processing import TokenLogprob
from selfspec.server.output_text import ResponseText
from selfspec.server.token_bytes import token_bytes_for
from selfspec.server.tool_calls import ParsedToolCall, make_parser


@dataclass
class ChoiceDelta:
    """What one update added to a choice."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.logprobs)


class ChoiceOutput:
    """The client-side state of one choice."""

    def __init__(self, text: ResponseText, tool_family: str | None) -> None:
        self.text = text
        self.parser = make_parser(tool_family) if tool_family is not None else None
        self.output_ids: list[int] = []
        self.answer_start: int | None = None
        self.content = ""
        self._held = ""  # whitespace-only content not yet shown (see `_hold_whitespace`)
        self.tool_calls: list[ParsedToolCall] = []
        self.logprobs: list[TokenLogprob] = []

    def update(
        self,
        new_ids: Sequence[int],
        answer_start: int | None,
        logprobs: Sequence[TokenLogprob | None] = (),
        *,
        final_ids: Sequence[int] | None = None,
        finished: bool = False,
    ) -> ChoiceDelta:
        """Add tokens (or, at the end, reconcile with the authoritative `final_ids`)."""
        self.output_ids.extend(new_ids)
        if final_ids is not None and list(final_ids[: len(self.output_ids)]) == self.output_ids:
            self.output_ids = list(final_ids)
        if answer_start is not None:
            self.answer_start = answer_start
        # Forced tokens (a thinking cap's close marker) were never chosen by the model: no logprob.
        chosen = [entry for entry in logprobs if entry is not None]
        self.logprobs.extend(chosen)
        text = self.text.update(self.output_ids, self.answer_start, finished=finished)
        delta = ChoiceDelta(reasoning=text.reasoning, logprobs=chosen)
        content = text.content
        if self.parser is not None:
            content, calls = self.parser.feed(content)
            if finished:
                more, late = self.parser.close()
                content, calls = content + more, calls + late
            for call in calls:
                delta.tool_calls.append(call.as_openai(index=len(self.tool_calls)))
                self.tool_calls.append(call)
            content = self._hold_whitespace(content, finished)
        self.content += content
        delta.content = content
        return delta

    def _hold_whitespace(self, content: str, finished: bool) -> str:
        """With tools, trailing whitespace waits until visible text follows it, and is dropped
        when the answer ends with calls: the newlines a model writes around and between its
        calls belong to the call syntax, not to the content. The rule depends only on the whole
        text, not on how it was chunked, so streamed and non-streamed replies carry the same
        content (none at all for calls alone)."""
        content = self._held + content
        visible = len(content.rstrip())
        self._held = content[visible:]
        if finished:
            self._held = ""
            return content if not self.tool_calls else content[:visible]
        return content[:visible]

    @property
    def reasoning(self) -> str | None:
        return self.text.reasoning_text

    def finish_reason(self, engine_reason: str) -> str:
        """OpenAI's vocabulary; "tool_calls" when the model stopped after calling tools."""
        if engine_reason == "stop" and self.tool_calls:
            return "tool_calls"
        return engine_reason

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.as_openai() for call in self.tool_calls]
            if not self.content.strip():
                message["content"] = None
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return message


# ---------------------------------------------------------------------- logprobs in OpenAI's shapes
def chat_logprobs(tokenizer: Any, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """`choice.logprobs` of a chat completion: one item per token with its top alternatives."""

    token_bytes = token_bytes_for(tokenizer)

    def item(token: int, logprob: float) -> dict[str, Any]:
        # `bytes` are the token's own (an emoji's first byte, not a replacement character's).
        return {"token": tokenizer.decode([token]), "logprob": logprob, "bytes": list(token_bytes(token))}

    content = []
    for entry in entries:
        row = item(entry.token, entry.logprob)
        row["top_logprobs"] = [item(t, lp) for t, lp in entry.top]
        content.append(row)
    return {"content": content}


def completion_logprobs(tokenizer: Any, entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """`choice.logprobs` of a text completion (the legacy parallel lists)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        text = tokenizer.decode([entry.token])
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        tops.append({tokenizer.decode([t]): lp for t, lp in entry.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
