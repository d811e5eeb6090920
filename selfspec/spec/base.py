"""The two shapes every speculation method shares: a `Proposer` and its `Proposal`.

A proposer turns the sequence so far into a guess of what comes next; a verifier
(see `verifiers.py`) decides how much of the guess the target model agrees with.
Keeping both behind one small interface is what lets a policy swap suffix lookup,
n-gram lookup or a draft model without the engine knowing which one it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch


@dataclass
class Proposal:
    """A proposed continuation.

    `tokens` may be empty (nothing worth proposing: the engine then runs a plain
    1-token decode). `draft_probs` is set only by proposers that *sample* their
    tokens from a distribution (a draft model): row i is the distribution token i
    was drawn from, which lossless rejection sampling needs. Deterministic
    proposers (suffix, n-gram) leave it `None`; their proposal is a one-hot draft.
    """

    tokens: list[int]
    draft_probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@runtime_checkable
class Proposer(Protocol):
    """Anything that proposes a continuation of a sequence.

    `context` is the sequence's full token ids so far (prompt + generated), as a
    list of Python ints. Implementations may keep incremental state keyed on the
    context growing by appends, so that a call costs O(new tokens) rather than
    O(len(context)); a context that shrinks or changes is handled by `reset()`
    (implementations also re-synchronise by themselves when they detect it).
    """

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal: ...


class ContextCursor:
    """Remembers how much of an append-only context a proposer has consumed.

    Why: proposers run on every decode step over a context that only grows, so
    they index just the tokens appended since the previous call. The divergence
    check is O(1) (length and the last consumed token), not a full comparison:
    it catches a rollback or a reused proposer, not an edit in the middle, which
    the Proposer contract rules out.
    """

    __slots__ = ("consumed", "_last_token")

    def __init__(self) -> None:
        self.consumed = 0
        self._last_token: int | None = None

    def reset(self) -> None:
        self.consumed = 0
        self._last_token = None

    def is_continuation(self, context: Sequence[int]) -> bool:
        """True when `context` extends (or equals) what was consumed before."""
        if len(context) < self.consumed:
            return False
        return self.consumed == 0 or context[self.consumed - 1] == self._last_token

    def advance(self, context: Sequence[int]) -> Sequence[int]:
        """Mark all of `context` consumed and return the newly appended tokens.

        The caller must have checked `is_continuation` (or reset) first.
        """
        start = self.consumed
        new_tokens = context[start:]
        self.consumed = len(context)
        if self.consumed:
            self._last_token = int(context[self.consumed - 1])
        return new_tokens
