"""What a client sees of a request's output: `reasoning_content`, `content`, stop strings.

The engine reports token ids and, for a thinking request, where the answer starts
(`ThinkingPolicy.metrics.answer_start`, placed after the end-of-thinking marker). This
module turns them into the two texts of an OpenAI-style response, the way vLLM's
reasoning parsers present them:

* reasoning: the tokens before the answer start, without the thinking markers and the
  whitespace around them (a forced close appends "\\n</think>\\n\\n");
* content: the answer tokens, without the blank line the template puts after the marker
  (non-thinking requests get their text untouched, so it equals the library's);
* both cut at the first stop string, as the engine stops right after one.

Streaming and non-streaming responses use the same `ResponseText`, so a stream's deltas
concatenate to exactly the non-streamed texts. Each channel's visible text is a slice
`raw[start:end]` of its detokenized text; while the request runs, `end` holds back
whatever the final text might still drop (trailing whitespace, a partial end marker, the
beginning of a stop string), so text already sent is never retracted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from selfspec.server.detokenizer import IncrementalDetokenizer


@dataclass(frozen=True)
class ChannelRules:
    """How one channel's raw text becomes visible text.

    strip_leading_whitespace: drop whitespace before the first visible character.
    start_marker: dropped when the text (after leading whitespace) begins with it.
    end_marker: dropped, with the whitespace around it, when the text ends with it.
    stops: the text ends before the first occurrence of any of these.
    """

    strip_leading_whitespace: bool = False
    start_marker: str = ""
    end_marker: str = ""
    stops: tuple[str, ...] = ()


def _partial_suffix_length(text: str, end: int, pattern: str) -> int:
    """Length of the longest proper prefix of `pattern` that `text[:end]` ends with."""
    if not pattern:
        return 0
    lo = max(0, end - len(pattern) + 1)
    first = pattern[0]
    i = text.find(first, lo, end)
    while i != -1:
        if pattern.startswith(text[i:end]):
            return end - i
        i = text.find(first, i + 1, end)
    return 0


class TextChannel:
    """One stream of text (reasoning or content) from its token ids, with hold-back."""

    def __init__(self, tokenizer: Any, rules: ChannelRules) -> None:
        self.rules = rules
        self._detok = IncrementalDetokenizer(tokenizer)
        self._start: int | None = None if (rules.strip_leading_whitespace or rules.start_marker) else 0
        self._stop_at: int | None = None  # index in raw text of the first stop string
        self._searched = 0  # raw text before this index holds no stop string
        self._sent_end = 0  # raw[start:_sent_end] has been emitted
        self.closed = False

    @property
    def num_tokens(self) -> int:
        return len(self._detok.ids)

    @property
    def text(self) -> str:
        """Everything emitted so far (the final text once `close` was called)."""
        if self._start is None:
            return ""
        return self._detok.text[self._start : self._sent_end]

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the newly visible text."""
        if self.closed:
            raise RuntimeError("the channel is closed")
        self._detok.add(token_ids)
        return self._emit(final=False)

    def close(self) -> str:
        """No more tokens: release what was held back and return it."""
        if self.closed:
            return ""
        self._detok.flush()
        delta = self._emit(final=True)
        self.closed = True
        return delta

    # ------------------------------------------------------------------ internals
    def _emit(self, final: bool) -> str:
        raw = self._detok.text
        self._find_stop(raw)
        if self._start is None:
            self._start = self._find_start(raw, final)
            if self._start is None:
                return ""
            self._sent_end = self._start
        end = self._visible_end(raw, final)
        if end <= self._sent_end:
            return ""
        delta = raw[self._sent_end : end]
        self._sent_end = end
        return delta

    def _find_stop(self, raw: str) -> None:
        if self._stop_at is not None or not self.rules.stops:
            return
        longest = max(len(s) for s in self.rules.stops)
        lo = max(0, self._searched - longest + 1)
        hits = [i for i in (raw.find(s, lo) for s in self.rules.stops) if i != -1]
        if hits:
            self._stop_at = min(hits)
        self._searched = len(raw)

    def _limit(self, raw: str) -> int:
        return len(raw) if self._stop_at is None else self._stop_at

    def _find_start(self, raw: str, final: bool) -> int | None:
        """Where visible text begins, or None while that is still undecided."""
        limit = self._limit(raw)
        i = 0
        if self.rules.strip_leading_whitespace or self.rules.start_marker:
            while i < limit and raw[i].isspace():
                i += 1
        marker = self.rules.start_marker
        if marker:
            rest = raw[i:limit]
            if rest.startswith(marker):
                i += len(marker)
                while i < limit and raw[i].isspace():
                    i += 1
            elif marker.startswith(rest) and not final:
                return None  # could still become the start marker
        if i >= limit and not final:
            return None  # only whitespace so far
        return min(i, limit)

    def _visible_end(self, raw: str, final: bool) -> int:
        start = self._start or 0
        end = self._limit(raw)
        if self.rules.end_marker:
            end = self._strip_end_marker(raw, start, end, final)
        if not final and self._stop_at is None:
            held = max(_partial_suffix_length(raw, end, s) for s in self.rules.stops) if self.rules.stops else 0
            end -= held
        return max(end, start)

    def _strip_end_marker(self, raw: str, start: int, end: int, final: bool) -> int:
        """Drop trailing whitespace + end marker + whitespace; while running, also a partial marker."""
        marker = self.rules.end_marker
        end = self._rstrip(raw, start, end)
        if raw.endswith(marker, start, end):
            end = self._rstrip(raw, start, end - len(marker))
        elif not final:
            partial = _partial_suffix_length(raw, end, marker)
            if partial:
                end = self._rstrip(raw, start, end - partial)
        return end

    @staticmethod
    def _rstrip(raw: str, start: int, end: int) -> int:
        while end > start and raw[end - 1].isspace():
            end -= 1
        return end


@dataclass
class TextDelta:
    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


class ResponseText:
    """Splits a request's output ids into reasoning and content channels, incrementally.

    `update(output_ids_so_far, answer_start)` may be called with a growing list (the
    output as committed so far); `answer_start` is the index in the output of the first
    answer token, or None while the request still thinks. A non-thinking request has no
    reasoning channel.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        thinking: bool,
        start_marker: str = "",
        end_marker: str = "",
        stops: Sequence[str] = (),
        split_reasoning: bool = True,
    ) -> None:
        stops = tuple(stops)
        self.thinking = thinking and split_reasoning
        self.reasoning: TextChannel | None = None
        if self.thinking:
            self.reasoning = TextChannel(
                tokenizer,
                ChannelRules(
                    strip_leading_whitespace=True, start_marker=start_marker, end_marker=end_marker, stops=stops
                ),
            )
        self.content = TextChannel(tokenizer, ChannelRules(strip_leading_whitespace=self.thinking, stops=stops))
        self._fed = 0

    def update(self, output_ids: Sequence[int], answer_start: int | None, *, finished: bool = False) -> TextDelta:
        """Feed the output committed so far; return the newly visible text of each channel."""
        delta = TextDelta()
        if len(output_ids) < self._fed:
            raise ValueError("output ids shrank below what was already streamed")
        if self.reasoning is not None and not self.reasoning.closed:
            boundary = len(output_ids) if answer_start is None else answer_start
            if boundary < self._fed:
                raise ValueError("the answer start moved before tokens already streamed as reasoning")
            if self._fed < boundary:
                delta.reasoning += self.reasoning.push(output_ids[self._fed : boundary])
                self._fed = boundary
            if answer_start is not None or finished:
                delta.reasoning += self.reasoning.close()
        if self._fed < len(output_ids):
            delta.content += self.content.push(output_ids[self._fed :])
            self._fed = len(output_ids)
        if finished:
            delta.content += self.content.close()
        return delta

    @property
    def reasoning_text(self) -> str | None:
        return None if self.reasoning is None else self.reasoning.text

    @property
    def content_text(self) -> str:
        return self.content.text
