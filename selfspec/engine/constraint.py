"""Per-sequence output constraints (a grammar, a tool-call format) as token masks.

A `SequenceConstraint` rides on `Sequence.constraint`. Before each forward the engine asks it,
for the step's pending position and every proposed token after it, which tokens are allowed
(`masks`): the mask of position i comes from the grammar state after the proposal's first i
tokens, and a proposal is cut at its first token the grammar refuses (the constrained target
can never choose it, so no verifier would accept it) and before a stop token the grammar accepts
(the grammar has ended there and nothing may follow; the verifier's bonus position draws that stop
token from the row that allows it, so the step commits as much). The matcher is rolled back, and
the committed tokens are caught up with at the next step (`sync`), so a method that proposes,
truncates or forces tokens needs to know nothing about the constraint: SSR, suffix decoding,
prompt lookup and draft models stay exact under a grammar — the committed tokens are those of
constrained decoding without speculation.

Reasoning is not constrained: with `open_after` (the end-of-thinking marker's token variants)
the grammar starts after the first such marker, so a thinking model thinks freely and its answer
follows the grammar; only `closed_forbids` (the stop tokens) are masked while it thinks, so a
request that asked for a format cannot end before its answer began. The grammar engine itself sits behind `GrammarState` (xgrammar in
`selfspec.engine.grammar`), so the engine core imports no grammar library.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch


class ConstraintViolation(RuntimeError):
    """A token the grammar refuses was committed anyway (a forced token): the output cannot
    follow the grammar any more."""


class GrammarState(Protocol):
    """One matcher's state over a token vocabulary (`selfspec.engine.grammar.XGrammarState`)."""

    vocab_size: int

    def allowed(self) -> torch.Tensor:
        """Bool [vocab]: the tokens the grammar accepts next."""

    def accept(self, token: int) -> bool:
        """Advance by one token; False (and no change) when the grammar refuses it."""

    def is_terminated(self) -> bool:
        """Whether the grammar accepted its stop token: it has ended, and neither `allowed` nor
        `accept` may be asked again until a rollback (xgrammar aborts the call)."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""

    def fork(self) -> "GrammarState":
        """An independent copy (a forked sequence's own state)."""


class SequenceConstraint:
    """The grammar state of one sequence's output, kept in step with its tokens.

    `start`: index in the sequence's token ids where constrained output begins (the request's
    prompt length; a fork keeps it, so an SSR child's forced close marker counts as output).
    `open_after`: token-id variants of a marker after which the grammar applies (empty: from the
    start); `closed_forbids`: tokens masked until then. The constraint keeps the tokens it consumed and, at `sync`, rolls back whatever the
    sequence no longer holds (a policy's truncation) and advances over what it gained.
    """

    def __init__(
        self,
        grammar: GrammarState,
        start: int,
        open_after: Sequence[Sequence[int]] = (),
        closed_forbids: Sequence[int] = (),
    ) -> None:
        self._grammar = grammar
        self.start = start
        self._open_after = tuple(tuple(v) for v in open_after if v)
        self._closed_row: torch.Tensor | None = None
        if self._open_after and closed_forbids:
            self._closed_row = torch.ones(grammar.vocab_size, dtype=torch.bool)
            self._closed_row[[t for t in closed_forbids if 0 <= t < grammar.vocab_size]] = False
        self._consumed: list[int] = []
        # Index in `_consumed` where the grammar begins (None: the gate is still closed).
        self._opened_at: int | None = None if self._open_after else 0

    # ------------------------------------------------------------------ keeping up with the sequence
    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def sync(self, token_ids: Sequence[int]) -> None:
        """Match the consumed tokens to `token_ids[start:]` (rollback, then advance)."""
        output = token_ids[self.start :]
        consumed = self._consumed
        common = len(consumed)
        if len(output) < common or output[:common] != consumed:
            common = 0
            limit = min(len(output), len(consumed))
            while common < limit and output[common] == consumed[common]:
                common += 1
            self._drop_after(common)
        for token in output[common:]:
            self._consume(int(token))

    def _drop_after(self, keep: int) -> None:
        if self._opened_at is not None:
            accepted_kept = max(0, keep - self._opened_at)
            accepted = len(self._consumed) - self._opened_at
            if accepted > accepted_kept:
                self._grammar.rollback(accepted - accepted_kept)
            if self._open_after and keep < self._opened_at:
                self._opened_at = None
        del self._consumed[keep:]

    def _consume(self, token: int) -> None:
        self._consumed.append(token)
        if self._opened_at is None:
            if self._gate_opens(self._consumed):
                self._opened_at = len(self._consumed)
            return
        if self._grammar.is_terminated():
            self._consumed.pop()
            raise ConstraintViolation(f"token {token} follows the end of the output grammar")
        if not self._grammar.accept(token):
            self._consumed.pop()
            raise ConstraintViolation(f"token {token} does not follow the output grammar")

    def _gate_opens(self, tokens: Sequence[int]) -> bool:
        return any(len(tokens) >= len(v) and tuple(tokens[len(tokens) - len(v) :]) == v for v in self._open_after)

    # ------------------------------------------------------------------ masks for one step
    def masks(self, proposal: Sequence[int]) -> tuple[torch.Tensor | None, int]:
        """Allowed tokens at the pending position and after each proposed token.

        Returns (mask, m): `m` is the length of the proposal's grammar-valid prefix (it stops
        before the grammar's stop token), `mask` a bool [m + 1, vocab] tensor (None when no
        position is constrained: the gate stays closed); a row of all False says the grammar has
        ended (the committed output holds its stop token). The grammar state is unchanged
        afterwards. Call after `sync`.
        """
        rows: list[torch.Tensor | None] = []
        accepted = 0
        tail = list(self._consumed[-max((len(v) for v in self._open_after), default=0) :]) if self._open_after else []
        opened = self._opened_at is not None
        valid = len(proposal)
        try:
            for i in range(len(proposal) + 1):
                if opened and self._grammar.is_terminated():
                    if i == 0:  # the committed output holds the grammar's stop token: nothing may follow
                        rows.append(torch.zeros(self._grammar.vocab_size, dtype=torch.bool))
                        valid = 0
                        break
                    # The previous proposal token was the grammar's stop token: cut before it, so the
                    # verifier draws it at the bonus position from the row that allows it (same step
                    # count), and no token past the end of the grammar is ever proposed.
                    valid = i - 1
                    break
                row = self._grammar.allowed() if opened else self._closed_row
                if row is not None and i > 0 and not bool(row.any()):
                    valid = i - 1  # the grammar ended at the previous token: that is the bonus position
                    break
                rows.append(row)
                if i == len(proposal):
                    break
                token = int(proposal[i])
                if opened:
                    if not bool(row[token]) or not self._grammar.accept(token):
                        valid = i
                        break
                    accepted += 1
                else:
                    tail.append(token)
                    opened = self._gate_opens(tail)
        finally:
            if accepted:
                self._grammar.rollback(accepted)
        if all(row is None for row in rows):
            return None, valid
        vocab = next(row for row in rows if row is not None).shape[-1]
        full = torch.ones(vocab, dtype=torch.bool)
        return torch.stack([full if row is None else row for row in rows]), valid

    def fork(self) -> "SequenceConstraint":
        """A copy for a forked sequence (SSR's drafts, the n samples of one prompt)."""
        twin = SequenceConstraint.__new__(SequenceConstraint)
        twin._grammar = self._grammar.fork()
        twin.start = self.start
        twin._open_after = self._open_after
        twin._closed_row = self._closed_row
        twin._consumed = list(self._consumed)
        twin._opened_at = self._opened_at
        return twin
