"""Prompt lookup and SuffixDecoding side by side: each step proposes the longer candidate.

Why: the two copy-based methods win on different text. Prompt lookup proposes up to its full
length whenever the last 1-3 tokens occurred before (aggressive: good where the CoT restates
the prompt verbatim); SuffixDecoding scales its proposal with the matched suffix's length and
frequency (cautious: good where phrasings repeat with variations). On a GPU a verify of 10-16
extra tokens costs about a decode step, so the longer of the two candidates is the one with
more to gain at almost no extra cost; where both propose nothing the step is a plain decode.

Once a child has proposed `max_tokens` tokens no later child can propose more (ties go to the
first), so the later ones are not asked that step: on a GPU the host's part of a step is a visible
share of a small model's, and in an answer that copies its CoT prompt lookup often fills the whole
room. A child that was not asked catches up on the context at its next call (prompt lookup and the
suffix index follow the context by a cursor, as they do after a verify that committed several
tokens), so what it proposes then is what it would have proposed had it been asked every step.
"""

from __future__ import annotations

from typing import Literal, Sequence

from selfspec.engine.policy import Proposal
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.suffix import SuffixConfig, SuffixProposer

ThinkingSpeculator = Literal["suffix", "ngram", "longest"]
"""What speculates a chain of thought: SuffixDecoding, prompt lookup, or the longer of both."""


class LongestProposer:
    """`Proposer` that asks the children in order and keeps the longest proposal (ties: the first
    child), asking no further once one fills `max_tokens`."""

    def __init__(self, proposers: Sequence) -> None:
        if not proposers:
            raise ValueError("LongestProposer needs at least one proposer")
        self.proposers = list(proposers)
        self.chosen_counts = [0] * len(self.proposers)
        """How many steps each child's candidate was the one proposed (diagnostics)."""

    def reset(self) -> None:
        for proposer in self.proposers:
            proposer.reset()

    def release(self) -> None:
        for proposer in self.proposers:
            proposer.release()

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal:
        best, best_index = Proposal(tokens=[]), -1
        for i, proposer in enumerate(self.proposers):
            proposal = proposer.propose(context, max_tokens)
            if len(proposal.tokens) > len(best.tokens):
                best, best_index = proposal, i
                if len(best.tokens) >= max_tokens:
                    break  # full: no later child can be longer (module docstring)
        if best_index >= 0:
            self.chosen_counts[best_index] += 1
        return best

    def add_source(self, name: str, tokens=()) -> None:
        """Extra sources (earlier drafts) go to every child that indexes sources."""
        for proposer in self.proposers:
            if hasattr(proposer, "add_source"):
                proposer.add_source(name, tokens)


def thinking_proposer(kind: ThinkingSpeculator, suffix: SuffixConfig):
    """The proposer a chain of thought is speculated with (`kind`), over the request's context."""
    if kind == "suffix":
        return SuffixProposer(suffix)
    if kind == "ngram":
        return NgramProposer()
    if kind == "longest":
        return LongestProposer([NgramProposer(), SuffixProposer(suffix)])
    raise ValueError(f"unknown thinking speculator {kind!r}; choose suffix, ngram or longest")
