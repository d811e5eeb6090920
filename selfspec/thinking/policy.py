"""Thinking-phase bookkeeping shared by every mode: CoT cap, continuation cap, phase timings.

The baseline and every speculative mode must produce the same tokens, so the rules that
shape a reasoning request's output (close thinking by force at the CoT cap, stop the answer
at the continuation cap, optionally ignore the model's own end marker and EOS for the
paper's fixed-length rows) live in one policy that the others extend. Speculation may
commit several tokens in one step; the rules are applied token by token, truncating what a
step committed past a cap, so the output does not depend on how many tokens a step took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from selfspec.engine.policy import Proposal, SequencePolicy, StepOutcome
from selfspec.engine.sequence import FinishReason
from selfspec.thinking.format import EndOfThinkingMatcher, ThinkingFormat

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence


@dataclass
class ThinkingLimits:
    """Length rules of a reasoning request.

    cot_cap: thinking is closed by force after this many CoT tokens (None: no cap).
    answer_cap: the answer stops after this many tokens (the paper's continuation cap).
    fixed_length: the paper-row setting: the model's own end-of-thinking marker and EOS are
      not honoured, so every request thinks exactly `cot_cap` tokens and answers exactly
      `answer_cap` tokens (both must be set).
    """

    cot_cap: int | None = None
    answer_cap: int | None = None
    fixed_length: bool = False

    def validate(self) -> None:
        for name in ("cot_cap", "answer_cap"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.fixed_length and (self.cot_cap is None or self.answer_cap is None):
            raise ValueError("fixed_length needs both cot_cap and answer_cap")


class Phase(str, Enum):
    """Where a reasoning request stands: writing its chain of thought, or its answer."""

    THINKING = "thinking"
    ANSWER = "answer"


class ClosedBy(str, Enum):
    """Who ended thinking: the model's own marker, or the CoT cap (a forced close)."""

    NOT_YET = ""  # still thinking, or never thought
    MODEL = "model"
    CAP = "cap"


@dataclass
class PhaseMetrics:
    cot_tokens: int = 0
    answer_tokens: int = 0
    thinking_closed_by: ClosedBy = ClosedBy.NOT_YET
    answer_start: int | None = None  # index in token_ids of the first answer token
    reasoning_end: int | None = None  # index where the end-of-thinking marker begins
    thinking_end_time: float | None = None
    first_answer_token_time: float | None = None
    extra: dict = field(default_factory=dict)


class ThinkingPolicy(SequencePolicy):
    """Tracks the thinking/answer phases of one sequence and applies the caps."""

    def __init__(
        self,
        fmt: ThinkingFormat | None,
        limits: ThinkingLimits | None = None,
        *,
        thinking: bool = True,
        proposer=None,
        history=None,
    ) -> None:
        self.fmt = fmt
        self.limits = limits or ThinkingLimits()
        self.limits.validate()
        self.thinking = thinking and fmt is not None and fmt.kind != "none"
        self.matcher = EndOfThinkingMatcher(fmt) if self.thinking else None
        self.phase = Phase.THINKING if self.thinking else Phase.ANSWER
        self.metrics = PhaseMetrics()
        self.proposer = proposer  # optional: speculation in both phases (suffix decoding, prompt lookup)
        self.history = history  # optional GlobalSuffixHistory that finished outputs are added to
        self._seen = 0  # output tokens already consumed

    # ------------------------------------------------------------------ hooks
    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        room = self._proposal_room(max_tokens)
        return self.proposer.propose(seq.token_ids, room) if room > 0 else None

    def _proposal_room(self, max_tokens: int) -> int:
        """Tokens this step may propose: the engine's room within the phase's (0: no proposer)."""
        return min(max_tokens, self._room_in_phase()) if self.proposer is not None else 0

    def proposal_group(self) -> object | None:
        # Only the plain rule above may be batched: a subclass with its own `propose` decides
        # more than the room, so it keeps the per-sequence call.
        if type(self).propose is not ThinkingPolicy.propose:
            return None
        key = getattr(self.proposer, "group_key", None)
        return None if key is None else (ThinkingPolicy, key)

    @staticmethod
    def propose_many(engine: "Engine", items: "list[tuple[Sequence, int]]") -> list[Proposal | None]:
        """`propose` for several sequences whose proposers share a `group_key` (one draft model)."""
        out: list[Proposal | None] = [None] * len(items)
        requests, where = [], []
        for index, (seq, max_tokens) in enumerate(items):
            room = seq.policy._proposal_room(max_tokens)
            if room > 0:
                requests.append((seq.policy.proposer, seq.token_ids, room))
                where.append(index)
        if requests:
            proposals = type(requests[0][0]).propose_group(requests)
            for index, proposal in zip(where, proposals):
                out[index] = proposal
        return out

    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        self._consume(engine, seq)

    def plain_next_step(self, seq: "Sequence") -> bool:
        """Plain thinking (no proposer, not a method's subclass) decodes one token a step until a
        cap: the step that reaches one forces the close of thinking or ends the answer."""
        return type(self) is ThinkingPolicy and self.proposer is None and self._room_in_phase() > 1

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        try:
            self._consume(None, seq)
            if self.history is not None and seq.num_output_tokens and seq.finish_reason is not FinishReason.CANCELLED:
                self.history.add_response(seq.seq_id, seq.output_ids)
        finally:
            # A draft model's KV slot is freed even when the rest failed (the engine then ends
            # this request with an error; the slot must not leak to the requests after it).
            if self.proposer is not None:
                self.proposer.release()

    # ------------------------------------------------------------------ rules
    def _room_in_phase(self) -> int:
        if self.phase is Phase.THINKING:
            cap = self.limits.cot_cap
            return 1 << 30 if cap is None else cap - self.metrics.cot_tokens
        cap = self.limits.answer_cap
        return 1 << 30 if cap is None else cap - self.metrics.answer_tokens

    def _consume(self, engine: "Engine | None", seq: "Sequence") -> None:
        """Apply the rules to output tokens not seen yet, in order."""
        while self._seen < seq.num_output_tokens:
            index = seq.prompt_len + self._seen
            token = seq.token_ids[index]
            self._seen += 1
            if self.phase is Phase.THINKING:
                self.metrics.cot_tokens += 1
                if not self.limits.fixed_length and self.matcher.feed(token):
                    self.metrics.reasoning_end = index + 1 - self.matcher.matched_length()
                    self._end_thinking(engine, seq, index + 1, by=ClosedBy.MODEL)
                    continue
                if self.limits.cot_cap is not None and self.metrics.cot_tokens >= self.limits.cot_cap:
                    if engine is None:
                        return
                    engine.truncate(seq, index + 1)
                    self.metrics.reasoning_end = index + 1
                    self._end_thinking(engine, seq, index + 1, by=ClosedBy.CAP)
                    engine.append_forced(seq, self.fmt.close_ids)
                    self._seen = seq.num_output_tokens  # the forced marker is not answer
                    self.on_thinking_closed(engine, seq)
                    return
            else:
                if self.metrics.answer_start is None:
                    self.metrics.answer_start = index
                if self.metrics.first_answer_token_time is None:
                    self.metrics.first_answer_token_time = time.perf_counter()
                self.metrics.answer_tokens += 1
                if self.limits.answer_cap is not None and self.metrics.answer_tokens >= self.limits.answer_cap:
                    if engine is None:
                        return
                    engine.truncate(seq, index + 1)
                    engine.finish(seq, FinishReason.LENGTH, "continuation cap")
                    return

    def _end_thinking(self, engine: "Engine | None", seq: "Sequence", answer_index: int, by: ClosedBy) -> None:
        self.phase = Phase.ANSWER
        self.metrics.thinking_closed_by = by
        self.metrics.thinking_end_time = time.perf_counter()
        if by is ClosedBy.MODEL and engine is not None:
            self.on_thinking_closed(engine, seq)

    def on_thinking_closed(self, engine: "Engine", seq: "Sequence") -> None:
        """Hook for subclasses (SSR verifies its draft here). Base: nothing."""

    def report(self) -> dict:
        """Method-specific metrics for the result (SSR: drafts, accepted prefix, ...). Base: none."""
        return {}
