"""The hooks through which policies (SSR, suffix decoding, CoSpec...) steer sequences.

The engine never asks "which mode am I in": each sequence may carry a policy object, and
the engine calls it at three points of a step. A policy that does nothing leaves plain
decoding, which is what the base class does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from selfspec.spec.base import Proposal
from selfspec.engine.verify import VerifyResult

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence


class SequencePolicy:
    """Default: plain decoding, no speculation, no forks."""

    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        """Tokens to verify in this step after the sequence's pending token (None: plain decode)."""
        return None

    def proposal_group(self) -> object | None:
        """A key shared by sequences whose proposals one batched call can make (a draft
        model's runner), or None. The engine then calls `propose_many` of this policy's
        class once per key and step instead of `propose` per sequence."""
        return None

    @staticmethod
    def propose_many(engine: "Engine", items: "list[tuple[Sequence, int]]") -> list[Proposal | None]:
        """Proposals for (sequence, max_tokens) pairs of one `proposal_group` key."""
        return [seq.policy.propose(engine, seq, room) for seq, room in items]

    def verify(
        self, engine: "Engine", seq: "Sequence", logits: torch.Tensor, proposal: Proposal
    ) -> VerifyResult | None:
        """Custom verification (e.g. an arbitrator); None uses the engine's exact verifier."""
        return None

    def on_tokens(self, engine: "Engine", seq: "Sequence", new_tokens: list[int]) -> None:
        """Called after tokens were committed to `seq` (not called once it finished)."""

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        """Called once when `seq` finishes, is cancelled or fails."""
