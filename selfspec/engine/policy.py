"""The contract between the engine and a request's speculation method.

The engine owns sequences, slots and forwards; a policy owns one sequence's speculation
state (SSR, suffix decoding, prompt lookup, a draft model, CoSpec). Per step the engine:

1. asks `propose(engine, seq, max_tokens)` for tokens to verify after the pending token
   (or `propose_many` once for every sequence of one `proposal_group`, e.g. one draft model);
2. runs one batched forward and verifies the proposal in `engine.verify` (or the policy's own
   `verify`, which only a lossy method such as CoSpec overrides, after one
   `prepare_verify_many` per `verify_group` key of the step's rows);
3. reports back with `on_step(engine, seq, outcome)`: what was proposed, how much of it was
   accepted and which tokens were committed, so no policy rebuilds that from counters;
4. calls `on_finish` once when the sequence ends, is cancelled or fails.

A policy may fork children, append forced tokens, truncate or cancel through the engine's
public methods from these hooks. The engine never asks which method it runs: a policy that
overrides nothing is plain decoding. An exception raised by any hook ends this request alone,
with finish reason "error" (`engine.isolation`); the batch goes on without it. A group call
(`propose_many`, `prepare_verify_many`) that raises is retried with each of its sequences alone,
so it must accept a list of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from selfspec.engine.logits_processing import has_penalties

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence
    from selfspec.engine.verify import VerifyResult


@dataclass
class Proposal:
    """Tokens a method proposes to follow the sequence's pending token.

    `draft_probs` is set only by proposers that *sample* their tokens (a draft model): row i is
    the distribution token i was drawn from, which lossless rejection sampling needs.
    Deterministic proposers (suffix, n-gram; SSR's draft unless it samples with `use_draft_probs`)
    leave it None: a one-hot draft.
    `source` names what produced the tokens (e.g. SSR's "prefix" or "suffix" stage); the engine
    hands it back in the `StepOutcome`, so the method knows what the verdict is about.
    """

    tokens: list[int]
    draft_probs: torch.Tensor | None = None
    source: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class StepOutcome:
    """What one engine step did to one sequence, as the policy's hooks receive it.

    proposal: what was verified this step (None: a plain decode step).
    accepted: proposal tokens accepted by verification (0 without a proposal).
    committed: tokens appended to the sequence this step (accepted prefix + the verifier's next
      token), cut at the first stop condition; a policy's cap may truncate them afterwards.
    """

    proposal: Proposal | None
    accepted: int
    committed: tuple[int, ...]

    @property
    def proposed(self) -> int:
        return 0 if self.proposal is None else len(self.proposal.tokens)


class SequencePolicy:
    """Base policy: plain decoding, no speculation, no forks. Methods override the hooks."""

    # True when `verify` is overridden: the engine then copies this row's logits to the host.
    custom_verify: ClassVar[bool] = False

    def propose(self, engine: Engine, seq: Sequence, max_tokens: int) -> Proposal | None:
        """Tokens to verify in this step after the sequence's pending token (None: plain decode)."""
        return None

    def proposal_group(self) -> object | None:
        """A key shared by sequences whose proposals one batched call can make (a draft
        model's runner), or None. The engine then calls `propose_many` (through the first
        sequence's policy) once per key and step instead of `propose` per sequence."""
        return None

    @staticmethod
    def propose_many(engine: Engine, items: list[tuple[Sequence, int]]) -> list[Proposal | None]:
        """Proposals for (sequence, max_tokens) pairs of one `proposal_group` key."""
        return [seq.policy.propose(engine, seq, room) for seq, room in items]

    def verify_group(self) -> object | None:
        """A key shared by sequences whose custom verifications one batched call can prepare
        (CoSpec: one arbitrator call for every request deciding in the step), or None."""
        return None

    @staticmethod
    def prepare_verify_many(engine: Engine, items: list[tuple[Sequence, list[int], Proposal]]) -> None:
        """Work `verify` will need, done once for a step's (sequence, greedy tokens of its logits
        rows, proposal) rows of one `verify_group` key, before any of them is verified. `verify`
        must give the same result with or without it."""

    def verify(self, engine: Engine, seq: Sequence, logits: torch.Tensor, proposal: Proposal) -> VerifyResult:
        """Custom verification (lossy methods only; set `custom_verify = True`)."""
        raise NotImplementedError("only policies with custom_verify = True verify by themselves")

    def on_step(self, engine: Engine, seq: Sequence, outcome: StepOutcome) -> None:
        """Called after a step committed tokens to `seq` (not called once it finished)."""

    def plain_next_step(self, seq: Sequence) -> bool:
        """Whether the next step will most likely be a plain one-token decode of `seq`, with no
        proposal, forced token, fork or custom verify: then the engine may launch it before this
        step's token is read (`engine.decode_ahead`). A wrong True costs a dropped forward, never
        a token (the engine takes a launched step only if it fed exactly what the next step
        feeds). Base: False, since a subclass that proposes may not say so."""
        return False

    def on_finish(self, engine: Engine, seq: Sequence) -> None:
        """Called once when `seq` finishes, is cancelled or fails."""


def verify_groups(
    rows: list[tuple[Sequence, list[int], Proposal | None]],
) -> list[list[tuple[Sequence, list[int], Proposal]]]:
    """The step's rows whose `prepare_verify_many` runs together: per `verify_group` key, two or
    more custom-verifying rows (groups of one decide in `verify` alone, the same work). `rows`
    carry the runner's greedy tokens (already on the host). Rows whose logits a grammar or a
    penalty will change first are left out: what was prepared from raw logits would not be what
    they verify. The engine makes one call per group (`engine.isolation.prepare_verifies`)."""
    groups: dict[object, list[tuple[Sequence, list[int], Proposal]]] = {}
    for seq, greedy, proposal in rows:
        policy = seq.policy
        if proposal is None or policy is None or not policy.custom_verify or seq.is_finished:
            continue
        if seq.constraint is not None or has_penalties(seq.params):
            continue
        key = policy.verify_group()
        if key is not None:
            groups.setdefault(key, []).append((seq, greedy, proposal))
    return [items for items in groups.values() if len(items) > 1]


def trimmed_proposal(proposal: Proposal | None, room: int) -> Proposal | None:
    """None for an empty proposal; at most `room` tokens (with their draft probabilities)."""
    if proposal is None or not proposal.tokens:
        return None
    if len(proposal.tokens) > room:
        probs = proposal.draft_probs[:room] if proposal.draft_probs is not None else None
        proposal = Proposal(proposal.tokens[:room], probs, proposal.source)
    return proposal
