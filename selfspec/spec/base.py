"""What every speculation method shares: its config base, its build context, the `Proposer` shape.

A method is a pydantic config (`MethodConfig`: one `method` name, validated knobs) that builds
a per-request policy (`engine.policy.SequencePolicy`) from a `MethodContext`. The engine talks
only to the policy; a proposer turns the sequence so far into a guess of what comes next, and
`engine.verify` decides how much of the guess the target model agrees with. Keeping these
shapes small is what lets a method be one module that the engine never names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, Sequence, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict

from selfspec.engine.policy import Proposal, SequencePolicy

if TYPE_CHECKING:
    from selfspec.engine.sampling import SamplingParams
    from selfspec.engine.step_costs import StepCosts
    from selfspec.spec.draft_gate import AcceptanceHistory
    from selfspec.spec.draft_model import DraftModelRunner
    from selfspec.spec.suffix import GlobalSuffixHistory
    from selfspec.thinking.format import ThinkingFormat
    from selfspec.thinking.policy import ThinkingLimits

__all__ = ["ContextCursor", "MethodConfig", "MethodContext", "Proposal", "Proposer"]


@dataclass
class MethodContext:
    """What a method needs from the `LLM` to build one request's policy (and nothing more, so
    methods do not depend on the facade): the thinking format and limits, the request's
    sampling parameters, the device, and the LLM's shared resources."""

    thinking_format: ThinkingFormat | None
    limits: ThinkingLimits | None
    thinking: bool
    params: SamplingParams
    device: torch.device
    global_history: GlobalSuffixHistory | None = None
    draft_runner: DraftModelRunner | None = None
    draft_acceptance: AcceptanceHistory | None = None  # SSR's cost gate: how well this LLM's drafts matched
    step_costs: StepCosts | None = None  # the engine's measured step costs (what a method may weigh at the start)
    rows: int = 1  # the rows the engine runs with this request admitted


class MethodConfig(BaseModel):
    """Base of every speculation config: a `method` discriminator and a `build` of the policy.

    `needs_thinking` says the method only makes sense on a thinking request (SSR): the facade
    then turns thinking on unless the caller said otherwise. `lossy` marks methods whose output
    may differ from plain decoding (CoSpec); every other method is exact.
    """

    model_config = ConfigDict(extra="forbid")
    needs_thinking: ClassVar[bool] = False
    lossy: ClassVar[bool] = False

    def build(self, ctx: MethodContext) -> SequencePolicy:
        raise NotImplementedError


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

    def release(self) -> None:
        """Free what the proposer holds (a draft model's KV slot); called when its sequence ends."""


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

    def copy(self) -> "ContextCursor":
        """A cursor at the same place (a forked proposer's)."""
        twin = ContextCursor()
        twin.consumed, twin._last_token = self.consumed, self._last_token
        return twin

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
