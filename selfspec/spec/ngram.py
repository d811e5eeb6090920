"""Prompt lookup decoding: copy what followed the last earlier occurrence of the trailing n-gram.

Same idea as transformers' `prompt_lookup_num_tokens` and vLLM's `ngram` method:
the context's last n tokens (largest n first) are searched in the context itself
and the tokens after their most recent earlier occurrence are proposed. Where
transformers scans the whole context every step, this keeps a table per n-gram
size of "n-gram -> start of its latest occurrence that has a continuation",
updated by the appended tokens only, so a call costs O(max_ngram) plus the copy.
"""

from __future__ import annotations

from typing import Literal, Sequence

from pydantic import Field, model_validator

from selfspec.engine.policy import Proposal
from selfspec.spec.base import ContextCursor, MethodConfig, MethodContext
from selfspec.thinking.policy import ThinkingPolicy


class NgramProposer:
    """`Proposer` that looks the context's trailing n-gram up in the context itself."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_tokens: int = 10) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if num_tokens < 0:
            raise ValueError("num_tokens must be >= 0")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.num_tokens = num_tokens
        self._sizes = range(max_ngram, min_ngram - 1, -1)
        # _latest[n][gram] = start of the latest occurrence of `gram` not at the very end.
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._cursor = ContextCursor()

    def reset(self) -> None:
        """Forget the indexed context (a new or rolled-back sequence)."""
        self._cursor.reset()
        for table in self._latest.values():
            table.clear()

    def fork(self) -> "NgramProposer":
        """A proposer of the same settings that has indexed what this one has, for a context that
        starts with that consumed prefix (an SSR draft forked from its parent's chain of thought).
        Its proposals equal a fresh proposer's over the same context, since indexing is
        append-only; copying the tables costs microseconds where re-indexing a 1,000-token chain of
        thought costs about a millisecond of host time in the step that forks."""
        twin = NgramProposer(self.max_ngram, self.min_ngram, self.num_tokens)
        twin._latest = {n: table.copy() for n, table in self._latest.items()}
        twin._cursor = self._cursor.copy()
        return twin

    def release(self) -> None:
        """Nothing to free: the tables die with the proposer."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal:
        self._index_appended(context)
        budget = min(self.num_tokens, max_tokens)
        length = len(context)
        if budget <= 0:
            return Proposal(tokens=[])
        for n in self._sizes:
            if n >= length:
                continue
            start = self._latest[n].get(tuple(context[length - n :]))
            if start is not None:
                return Proposal(tokens=[int(t) for t in context[start + n : start + n + budget]])
        return Proposal(tokens=[])

    def _index_appended(self, context: Sequence[int]) -> None:
        if not self._cursor.is_continuation(context):
            self.reset()
        first_new = self._cursor.consumed
        self._cursor.advance(context)
        # Appending position j gives a continuation to every n-gram ending at j - 1.
        for j in range(max(first_new, 1), len(context)):
            for n in self._sizes:
                if j >= n:
                    self._latest[n][tuple(context[j - n : j])] = j - n


class PromptLookupConfig(MethodConfig):
    """Prompt lookup (n-gram) decoding, as transformers' `prompt_lookup_num_tokens` and vLLM's
    `method: ngram`: in both phases, under the thinking rules."""

    method: Literal["ngram"] = "ngram"
    max_ngram: int = Field(3, ge=1, le=32)
    min_ngram: int = Field(1, ge=1, le=32)
    num_tokens: int = Field(10, ge=1, le=256)

    @model_validator(mode="after")
    def _check(self) -> "PromptLookupConfig":
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must not exceed max_ngram ({self.max_ngram})")
        return self

    def build(self, ctx: MethodContext) -> ThinkingPolicy:
        proposer = NgramProposer(max_ngram=self.max_ngram, min_ngram=self.min_ngram, num_tokens=self.num_tokens)
        return ThinkingPolicy(ctx.thinking_format, ctx.limits, thinking=ctx.thinking, proposer=proposer)
