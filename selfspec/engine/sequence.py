"""One sequence: token ids, its KV slot, status and the bookkeeping the engine needs.

A *request* may own several sequences (SSR forks children from a parent); each sequence
owns at most one slot. `num_cached` counts the tokens whose K/V are in the slot; the tokens
after it (`pending`) are fed at the next step: the last sampled token, forced tokens (an
end-of-thinking marker appended to a fork), or the rest of a prompt being prefilled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from itertools import count
from typing import TYPE_CHECKING, Any

import torch

from selfspec.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from selfspec.engine.constraint import SequenceConstraint
    from selfspec.engine.logits_processing import TokenLogprob
    from selfspec.engine.policy import SequencePolicy


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or a policy's cap
    CANCELLED = "cancelled"
    ERROR = "error"


_ids = count()


@dataclass
class SequenceStats:
    """Counters a policy or benchmark reads after the fact."""

    forwards: int = 0  # forwards this sequence took part in (after prefill)
    prefill_forwards: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0  # proposal tokens accepted by verification
    verify_steps: int = 0  # steps that carried a non-empty proposal


@dataclass
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    policy: "SequencePolicy | None" = None
    parent: "Sequence | None" = None
    eos_token_ids: frozenset[int] = frozenset()
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    finish_detail: str = ""
    slot: int | None = None
    num_cached: int = 0
    prompt_len: int = 0
    # Tokens appended by the engine on behalf of a policy (not sampled); excluded from
    # min/max token counting of the answer only where the policy says so.
    forced_token_count: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    stats: SequenceStats = field(default_factory=SequenceStats)
    children: list["Sequence"] = field(default_factory=list)
    user_data: dict[str, Any] = field(default_factory=dict)
    # When set (sampled requests only), the engine keeps the distribution each committed
    # token was drawn from, so a draft can later be verified with its own probabilities.
    record_probs: bool = False
    sampled_probs: list[torch.Tensor] = field(default_factory=list)
    # One entry per output token: the forward shape whose logits chose it (`ForwardResult.shapes`),
    # "forced" for tokens a policy appended. Kept aligned by the engine's append/truncate; a
    # diagnostic for bf16 near-ties (which shape rounded differently), not used for decisions.
    output_shapes: list[str] = field(default_factory=list)
    # The grammar the output follows (None: free); see `engine.constraint`.
    constraint: "SequenceConstraint | None" = None
    # Per output token when `params.logprobs` is set (None for forced tokens); aligned like output_shapes.
    logprobs: "list[TokenLogprob | None]" = field(default_factory=list)
    # Where the request's output begins in `token_ids`: the prompt length, kept by forks (an SSR
    # draft's prompt holds the parent's output), so penalties count the same tokens in both.
    output_start: int = 0
    # The other samples of an n > 1 request, started from this sequence's prefill (`Engine.add_request`).
    siblings: list["Sequence"] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_len:
            self.prompt_len = len(self.token_ids)
        if not self.output_start:
            self.output_start = self.prompt_len

    __eq__ = object.__eq__  # identity: the scheduler's list lookups must not compare every field
    __hash__ = object.__hash__

    @property
    def pending(self) -> list[int]:
        return self.token_ids[self.num_cached :]

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
