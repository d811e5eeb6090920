"""The references engine exactness is checked against: transformers' own greedy `generate`, on
random prompts, and a loop that steps an engine until its sequences finish.

Shared by the CPU exactness tests and the GPU check script, so every check compares against the
same reference call (explicit all-ones attention mask: a token id 0 inside a context is a real
token, not padding; no EOS: exactly `n` tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch

from selfspec.engine.policy import Proposal, SequencePolicy

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt`, by transformers' `generate` on the model's device."""
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    """One random prompt per length, token ids in [1, vocab), reproducible by `seed`."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def run_to_finish(engine: "Engine", seqs: Iterable, max_steps: int = 10_000) -> None:
    """Step `engine` until every sequence in `seqs` has finished; fail after `max_steps`."""
    seqs = list(seqs)
    for _ in range(max_steps):
        if all(s.is_finished for s in seqs):
            return
        engine.step()
    raise AssertionError(f"sequences did not finish within {max_steps} steps")


class ScriptedProposals(SequencePolicy):
    """A speculation policy for tests: every step it proposes the reference's next `good` tokens
    followed by `bad` wrong ones (each reference token + 1, mod `vocab`), so verification accepts
    exactly `good` tokens and rolls back the rest; `accepted` keeps each step's count."""

    def __init__(self, reference: list[int], good: int, bad: int, vocab: int) -> None:
        self.reference, self.good, self.bad, self.vocab = reference, good, bad, vocab
        self.accepted: list[int] = []

    def propose(self, engine, seq, max_tokens):
        done = seq.num_output_tokens
        ahead = self.reference[done : done + self.good]
        later = self.reference[done + len(ahead) : done + len(ahead) + self.bad]
        tokens = (ahead + [(t + 1) % self.vocab for t in later])[:max_tokens]
        return Proposal(tokens) if tokens else None

    def on_step(self, engine, seq, outcome):
        if outcome.proposal is not None:
            self.accepted.append(outcome.accepted)
