"""SSR: fork drafts from a partial chain of thought, verify them under the full one.

One `SSRPolicy` rides on the parent sequence; each draft is a child sequence with a
`DraftPolicy`. Timeline of a request:

1. Thinking. At each draft budget (a CoT length) the parent is forked: the child copies
   the parent's KV (no recomputation), gets the end-of-thinking tokens appended, and
   decodes an answer from the partial CoT in the same batched steps as the parent.
   With iterative drafting a later child is speculated from earlier drafts (they mostly
   agree), so it costs fewer steps; forking a new draft cancels older ones still running.
2. The parent ends thinking (its own marker, or the CoT cap). Running drafts are
   cancelled and their slots freed; what they wrote stays usable.
3. Prefix verification: the newest draft is proposed in chunks, anchored on the
   end-of-thinking marker (a cursor over marker + draft), and the engine's
   exact verifier accepts the longest prefix the model agrees with under the full CoT.
4. Draft-backed suffix decoding: after the first mismatch, a SuffixDecoding tree over the
   drafts (and optionally prompt / output / global history) proposes continuations.

Every token the parent commits went through the exact verifier, so the output equals plain
decoding (greedy: token-identical; sampling: same distribution by rejection sampling).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from selfspec.engine.policy import Proposal, SequencePolicy, StepOutcome
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.sequence import FinishReason
from selfspec.spec.draft_gate import AcceptanceHistory, copy_steps
from selfspec.spec.draft_schedule import DraftSchedule
from selfspec.spec.longest import thinking_proposer
from selfspec.spec.ssr_core import (
    THINKING_SOURCE,
    AnswerSpeculator,
    Draft,
    ReuseMode,
    SSRConfig,
    SSRStage,
    SuffixSource,
    cut_before_end,
    draft_proposer,
)
from selfspec.spec.suffix import GlobalSuffixHistory
from selfspec.thinking.format import ThinkingFormat
from selfspec.thinking.policy import Phase, ThinkingLimits, ThinkingPolicy

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence

__all__ = ["Draft", "DraftPolicy", "ReuseMode", "SSRConfig", "SSRPolicy", "SSRStage", "SuffixSource"]


class DraftPolicy(SequencePolicy):
    """A child: decode the draft answer; optionally speculate it from earlier drafts."""

    def __init__(self, owner: "SSRPolicy", draft: Draft, earlier: list[Draft]) -> None:
        self.owner = owner
        self.draft = draft
        self.proposer = draft_proposer(owner.config, earlier, context_proposer=owner.proposer)

    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        if self.proposer is None:
            return None
        room = self.owner.draft_proposal_room(engine, max_tokens)
        if room <= 0:
            return None
        return self.proposer.propose(seq.token_ids, room)

    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        self.owner.on_draft_step(outcome)
        self._sync(seq)

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        self._sync(seq)
        self.owner.on_draft_finished(self.draft)

    def _sync(self, seq: "Sequence") -> None:
        # Append only what is new: this runs on every draft step (per-token path).
        have = len(self.draft.tokens)
        self.draft.tokens.extend(seq.token_ids[seq.prompt_len + have :])
        if seq.record_probs:
            self.draft.probs = seq.sampled_probs  # the engine's list, grown in place


def _draft_running(draft: Draft) -> bool:
    """A draft's forked sequence still decodes (the engine backend's `draft_running`)."""
    return not draft.seq.is_finished


class _EngineDrafts:
    """`ssr_core.DraftBackend` over this engine: a draft is a forked sequence (KV copied, no
    recompute) with the end-of-thinking tokens appended; cancelling frees its slot."""

    def __init__(self, owner: "SSRPolicy", engine: "Engine", seq: "Sequence") -> None:
        self.owner, self.engine, self.seq = owner, engine, seq

    def fork_draft(self, draft: Draft, earlier: list[Draft]) -> "Sequence | None":
        parent = self.seq.params
        params = SamplingParams(
            max_tokens=self.owner.config.max_draft_len,
            temperature=parent.temperature,
            top_k=parent.top_k,
            top_p=parent.top_p,
            min_p=parent.min_p,
            seed=None if parent.seed is None else parent.seed + 7919 * (draft.index + 1),
            ignore_eos=parent.ignore_eos,
            stop_token_ids=list(parent.stop_token_ids),
        )
        policy = DraftPolicy(self.owner, draft, earlier)
        child = self.engine.fork(self.seq, draft.anchor, params=params, policy=policy)
        if child is not None:
            child.record_probs = self.owner.config.use_draft_probs and not params.greedy
        return child

    def cancel_draft(self, draft: Draft, reason: str) -> None:
        self.engine.cancel(draft.seq, reason)

    def draft_running(self, draft: Draft) -> bool:
        return _draft_running(draft)

    def step_costs(self):
        """The engine's measured step costs, its running rows that are no draft, and the drafts of
        other requests running beside them (the gate shares the rows' cost out among all drafts)."""
        running = self.engine.scheduler.running
        drafts = sum(1 for s in running if isinstance(s.policy, DraftPolicy))
        own = sum(1 for d in self.owner.drafts if not d.seq.is_finished)
        return self.engine.step_costs, len(running) - drafts, drafts - own


class SSRPolicy(ThinkingPolicy):
    """The parent's policy: the thinking rules, plus `ssr_core`'s schedule and answer stages."""

    def __init__(
        self,
        config: "SSRConfig",
        fmt: ThinkingFormat | None,
        limits: ThinkingLimits | None,
        *,
        thinking: bool = True,
        global_history: GlobalSuffixHistory | None = None,
        acceptance: AcceptanceHistory | None = None,
    ) -> None:
        history = global_history if "global" in config.suffix_sources else None
        # Thinking-phase speculation (config.speculate_thinking) is the base policy's own
        # proposer (SuffixDecoding, prompt lookup or the longer of both over prompt + output),
        # used here in the thinking phase only.
        think_proposer = (
            thinking_proposer(config.thinking_speculator, config.suffix.to_config(index_context=True))
            if config.speculate_thinking
            else None
        )
        super().__init__(fmt, limits, thinking=thinking, proposer=think_proposer, history=history)
        self.config = config
        self.schedule = DraftSchedule(config, self.limits.cot_cap, self.thinking, acceptance)
        self.acceptance = acceptance
        variants = (fmt.end_variants or (fmt.end_ids,)) if fmt is not None else ()
        self.answer = AnswerSpeculator(config, variants, global_history=global_history, context_proposer=self.proposer)
        # CoT proposals never cross an end-of-thinking token (see _thinking_proposal).
        self._end_variants: tuple[tuple[int, ...], ...] = ()
        if self.proposer is not None and self.thinking:
            self._end_variants = tuple(tuple(v) for v in variants)
        # The tokens that complete some variant: a proposal holding none of them is never cut.
        self._end_last = frozenset(v[-1] for v in self._end_variants if v)
        self.thinking_verify_steps = 0
        self._close_ids = list(fmt.close_ids) if fmt is not None else []  # a fork's anchor (copied per draft)
        self._drafts_backend: _EngineDrafts | None = None

    def _backend(self, engine: "Engine", seq: "Sequence") -> _EngineDrafts:
        """The drafts' backend of this request (its engine and sequence never change): built once,
        not on every CoT step a draft runs."""
        backend = self._drafts_backend
        if backend is None or backend.engine is not engine or backend.seq is not seq:
            backend = self._drafts_backend = _EngineDrafts(self, engine, seq)
        return backend

    @property
    def drafts(self) -> list[Draft]:
        return self.schedule.drafts

    @property
    def stage(self) -> SSRStage:
        return self.answer.stage

    # ------------------------------------------------------------------ proposing
    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        if self.phase is not Phase.ANSWER:
            return self._thinking_proposal(engine, seq, max_tokens)
        return self.answer.propose(seq.token_ids, min(max_tokens, self._room_in_phase()))

    def _thinking_proposal(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        """CoT tokens speculated over prompt + output, cut before any token of the
        end-of-thinking marker (`ssr_core.cut_before_end`)."""
        tokens = self._thinking_tokens(seq, max_tokens)
        return Proposal(tokens, source=THINKING_SOURCE) if tokens else None  # verified as a one-hot draft

    def _thinking_tokens(self, seq: "Sequence", max_tokens: int) -> list[int] | None:
        """`_thinking_proposal`'s tokens, or None: the copy over prompt + output, cut before the
        end-of-thinking marker. Runs on every CoT step, so it calls the proposer directly (the
        base policy's rule: at most the room left in the phase)."""
        room = self._proposal_room(max_tokens)  # 0 without thinking speculation
        if room <= 0:
            return None
        tokens = self.proposer.propose(seq.token_ids, room).tokens
        if tokens and not self._end_last.isdisjoint(tokens):
            tokens = cut_before_end(tokens, seq.token_ids, self._end_variants)
        return tokens or None

    # ------------------------------------------------------------------ reacting
    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        source = outcome.proposal.source if outcome.proposal is not None else None
        if source == THINKING_SOURCE:
            self.thinking_verify_steps += 1
        elif self.phase is Phase.ANSWER:
            self.answer.on_verdict(source, outcome.accepted, outcome.proposed, list(outcome.committed))
        self._consume(engine, seq)
        if seq.is_finished or self.phase is not Phase.THINKING:
            return
        cot_tokens = self.metrics.cot_tokens
        if self.schedule.wants_step(cot_tokens, _draft_running):
            self.schedule.on_cot(cot_tokens, self._close_ids, self._backend(engine, seq))

    def on_thinking_closed(self, engine: "Engine", seq: "Sequence") -> None:
        """The parent's CoT is complete: stop drafting, set up verification."""
        usable = self.schedule.close(self._backend(engine, seq))
        self.answer.start(seq.token_ids, usable)

    def on_draft_finished(self, draft: Draft) -> None:
        """A draft ended (EOS, its length cap, or cancelled); nothing to do until thinking ends."""

    def draft_proposal_room(self, engine: "Engine", max_tokens: int) -> int:
        """How many tokens a draft child of this request may propose this step (its own
        speculation, `draft_proposer`): all the engine allows here; a subclass that sizes
        proposals by cost (auto) cuts it, since every draft token verified is the parent's bill."""
        return max_tokens

    def on_draft_step(self, outcome: StepOutcome) -> None:
        """A draft child's step was verified (what its own proposal, if any, got accepted)."""

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        super().on_finish(engine, seq)
        finished_answer = self.phase is Phase.ANSWER and seq.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if self.acceptance is not None and finished_answer and self.config.reuse != "off":
            # What this request's drafts were worth, for the gate of the requests after it (an answer
            # that ended inside the draft's prefix counts its whole match: `taken_from_drafts`).
            drafted = sum(len(d.tokens) for d in self.drafts)
            answer = self.metrics.answer_tokens
            copied = None
            if self.schedule.gate is not None and answer > 0:  # what the copy path would have paid for it
                copied = copy_steps(seq.token_ids[:-answer], seq.token_ids[-answer:])
            taken = self.answer.taken_from_drafts(answer)
            self.acceptance.record(
                drafted,
                taken,
                answer_tokens=answer,
                copy_steps=copied,
                answer_steps=self.answer.answer_forwards,
                draft_forwards=sum(d.seq.stats.forwards for d in self.drafts),
            )
        if engine is not None:
            backend = self._backend(engine, seq)
            for draft in self.drafts:
                if backend.draft_running(draft):
                    engine.cancel(draft.seq, "parent finished")

    # ------------------------------------------------------------------ metrics
    def report(self) -> dict:
        out = self.schedule.report()
        out["draft_forwards"] = sum(d.seq.stats.forwards for d in self.drafts)
        out["thinking_verify_steps"] = self.thinking_verify_steps
        out.update(self.answer.report(self.metrics.answer_tokens))
        return out
