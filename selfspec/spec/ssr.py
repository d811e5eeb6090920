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

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from pydantic import Field, model_validator

from selfspec.engine.policy import Proposal, SequencePolicy, StepOutcome
from selfspec.engine.sampling import SamplingParams
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.suffix import GlobalSuffixHistory, SuffixConfig, SuffixOptions, SuffixProposer
from selfspec.thinking.format import ThinkingFormat
from selfspec.thinking.policy import Phase, ThinkingLimits, ThinkingPolicy

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence

ReuseMode = Literal["off", "prefix", "suffix", "prefix+suffix"]
SuffixSource = Literal["draft", "prompt", "output", "global"]


class SSRStage(str, Enum):
    """The parent's speculation stage: drafting while it thinks, then verifying the draft's
    prefix, then draft-backed suffix decoding, then plain decoding once no source helps."""

    THINKING = "thinking"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    PLAIN = "plain"


class SSRConfig(MethodConfig):
    """How one request speculates on itself.

    draft_budgets: CoT lengths at which a draft is forked (one or several).
    draft_interval: iterative drafting: fork every `draft_interval` CoT tokens (overrides
      `draft_budgets`), up to `max_drafts` (None: until thinking ends or the CoT cap).
    max_draft_len: a draft stops after this many answer tokens.
    reuse: off (drafts made, not used: the overhead figure) | prefix (verify the draft under
      the full CoT, accept the longest prefix) | suffix (draft as a suffix-decoding source
      only) | prefix+suffix.
    suffix_sources: where suffix speculation copies from; "draft" by default, as the paper.
    speculate_drafts: a later draft is speculated from earlier ones (iterative drafting).
    cancel_older_drafts: forking a new draft cancels older drafts still running (their
      partial tokens stay usable as sources).
    use_draft_probs: sampled requests keep each draft token's distribution and verify the
      draft by rejection sampling with those probabilities (Leviathan et al.); otherwise the
      draft is verified as a deterministic proposal. Both are exact in distribution; this
      one accepts more but holds a [draft_len, vocab] tensor per draft.
    prefix_chunk_start / prefix_chunk_max: prefix verification proposes the draft in runs that
      start at `prefix_chunk_start` tokens and double after each fully accepted run, up to
      `prefix_chunk_max` (and the engine's cap: max_proposal_tokens, with static forwards at most
      the largest token bucket less the pending token, 63 by default). An early mismatch then costs
      a short verify; a matching draft still goes through in a few forwards. Where a k-token
      verify costs the same as a decode step (GPU), set both to 64.
    speculate_thinking: the parent also speculates its chain of thought with SuffixDecoding
      over its prompt and output (as the suffix-decoding mode does): thinking models copy
      the task into their CoT and the CoT into the answer, so many CoT tokens come free
      while the draft runs. Proposals stop before any end-of-thinking token, so thinking is
      always closed by a plain step and the draft verification starts aligned.
    suffix_backoff_max: after a suffix proposal of which nothing is accepted,
      skip the next 1, 2, 4, ... (at most `suffix_backoff_max`) answer steps before proposing
      again; an accepted token resets it. A draft that stopped tracking the answer then costs
      a few verifies instead of one per token (a k-token verify costs ~1.3 decode steps on
      the H200). It only decides when to propose, so outputs are unchanged. 0 disables it.
    """

    needs_thinking: ClassVar[bool] = True

    method: Literal["ssr"] = "ssr"
    draft_budgets: list[int] = Field(default_factory=lambda: [500])
    draft_interval: int | None = Field(None, ge=1)
    max_drafts: int | None = Field(None, ge=1)
    max_draft_len: int = Field(500, ge=1)
    reuse: ReuseMode = "prefix+suffix"
    suffix: SuffixOptions = Field(default_factory=SuffixOptions)
    suffix_sources: list[SuffixSource] = Field(default_factory=lambda: ["draft"])
    speculate_drafts: bool = True
    cancel_older_drafts: bool = True
    use_draft_probs: bool = False
    prefix_chunk_start: int = Field(8, ge=1, le=4096)
    prefix_chunk_max: int = Field(64, ge=1, le=4096)
    suffix_backoff_max: int = Field(16, ge=0, le=4096)
    speculate_thinking: bool = False

    @model_validator(mode="after")
    def _check(self) -> "SSRConfig":
        if not self.draft_budgets and self.draft_interval is None:
            raise ValueError("give draft_budgets or draft_interval")
        if any(b < 1 for b in self.draft_budgets):
            raise ValueError("draft budgets must be positive CoT lengths")
        self.draft_budgets = sorted(set(self.draft_budgets))
        if not self.suffix_sources:
            raise ValueError("suffix_sources must not be empty")
        if self.prefix_chunk_start > self.prefix_chunk_max:
            raise ValueError(
                f"prefix_chunk_start ({self.prefix_chunk_start}) must not exceed prefix_chunk_max ({self.prefix_chunk_max})"
            )
        return self

    def budgets_up_to(self, cot_cap: int | None) -> list[int]:
        """The CoT lengths at which to fork, for a request with this CoT cap."""
        if self.draft_interval is None:
            budgets = list(self.draft_budgets)
        else:
            limit = cot_cap if cot_cap is not None else 1 << 20
            budgets = list(range(self.draft_interval, limit, self.draft_interval))
        if cot_cap is not None:
            budgets = [b for b in budgets if b < cot_cap]
        if self.max_drafts is not None:
            budgets = budgets[: self.max_drafts]
        return budgets

    def build(self, ctx: MethodContext) -> "SSRPolicy":
        return SSRPolicy(
            self, ctx.thinking_format, ctx.limits, thinking=ctx.thinking, global_history=ctx.global_history
        )


# Prefix verification proposes whole draft runs; the engine splits them into chunks of
# its `max_proposal_tokens`, so the cap here only needs to exceed that.
_UNCAPPED = SuffixConfig(
    mode="longest_match", max_spec_tokens=1 << 16, spec_factor=float(1 << 16), spec_offset=float(1 << 16)
)


@dataclass
class Draft:
    """One fork: the CoT length it saw, its sequence, and the answer tokens it wrote."""

    index: int
    cot_tokens: int
    seq: "Sequence"
    anchor: list[int]  # the end-of-thinking tokens appended at the fork
    tokens: list[int] = field(default_factory=list)
    probs: list = field(default_factory=list)  # per draft token, when the request samples with draft probs
    cancelled: bool = False

    @property
    def source(self) -> list[int]:
        """Anchor + draft answer: what the parent's answer is matched against."""
        return self.anchor + self.tokens


class DraftPolicy(SequencePolicy):
    """A child: decode the draft answer; optionally speculate it from earlier drafts."""

    def __init__(self, owner: "SSRPolicy", draft: Draft, earlier: list[Draft]) -> None:
        self.owner = owner
        self.draft = draft
        self.proposer: SuffixProposer | None = None
        usable = [d for d in earlier if d.tokens] if owner.config.speculate_drafts else []
        if owner.config.speculate_thinking:
            # The draft runs only until the parent ends thinking, and thinking-phase
            # speculation ends it sooner: the draft is speculated from its own context too
            # (the answer copies the CoT), so it gets as far in fewer steps.
            self.proposer = SuffixProposer(owner.config.suffix.to_config(index_context=True))
        elif usable:
            self.proposer = SuffixProposer(_UNCAPPED)
        for d in usable:
            self.proposer.add_source(f"draft:{d.index}", d.source)

    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        if self.proposer is None:
            return None
        return self.proposer.propose(seq.token_ids, max_tokens)

    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
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


class SSRPolicy(ThinkingPolicy):
    """The parent's policy: when to fork, what to propose, what to report."""

    def __init__(
        self,
        config: "SSRConfig",
        fmt: ThinkingFormat | None,
        limits: ThinkingLimits | None,
        *,
        thinking: bool = True,
        global_history: GlobalSuffixHistory | None = None,
    ) -> None:
        history = global_history if "global" in config.suffix_sources else None
        # Thinking-phase speculation (config.speculate_thinking) is the base policy's own
        # proposer (SuffixDecoding over prompt + output), used here in the thinking phase only.
        think_proposer = (
            SuffixProposer(config.suffix.to_config(index_context=True)) if config.speculate_thinking else None
        )
        super().__init__(fmt, limits, thinking=thinking, proposer=think_proposer, history=history)
        self.config = config
        self.budgets = config.budgets_up_to(self.limits.cot_cap) if self.thinking else []
        self.drafts: list[Draft] = []
        self.global_history = global_history if "global" in config.suffix_sources else None
        self.stage = SSRStage.THINKING
        self.suffix_proposer: SuffixProposer | None = None
        self.verified_draft: Draft | None = None
        self.fork_failures = 0
        # acceptance bookkeeping
        self.accepted_prefix = 0
        self.suffix_accepted = 0
        self.answer_verify_steps = 0
        self.answer_forwards = 0
        self.prefix_cursor = 0
        self.prefix_start = 0
        self.prefix_source: list[int] = []
        self._prefix_chunk = config.prefix_chunk_start
        self._suffix_fail_streak = 0  # consecutive suffix proposals with nothing accepted
        self._suffix_skip = 0  # answer steps left before the next suffix proposal
        self.suffix_skipped_steps = 0
        # CoT proposals never cross an end-of-thinking token (see _thinking_proposal).
        self._end_token_ids: frozenset[int] = frozenset()
        if self.proposer is not None and self.thinking:
            variants = fmt.end_variants or (fmt.end_ids,)
            self._end_token_ids = frozenset(t for variant in variants for t in variant) | frozenset(fmt.close_ids)
        self.thinking_verify_steps = 0

    # ------------------------------------------------------------------ proposing
    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        if self.phase is not Phase.ANSWER:
            return self._thinking_proposal(engine, seq, max_tokens)
        room = min(max_tokens, self._room_in_phase())
        if room <= 0:
            return None
        if self.stage is SSRStage.PREFIX:
            proposal = self._prefix_proposal(room)
            if proposal is not None:
                return proposal
            self._leave_prefix()
        if self.stage is SSRStage.SUFFIX and self.suffix_proposer is not None:
            if self._suffix_skip > 0:
                self._suffix_skip -= 1
                self.suffix_skipped_steps += 1
                return None
            proposal = self.suffix_proposer.propose(seq.token_ids, room)
            if proposal.tokens:
                return Proposal(proposal.tokens, source=SSRStage.SUFFIX.value)
        return None

    def _thinking_proposal(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        """CoT tokens from SuffixDecoding over prompt + output, cut before any token of the
        end-of-thinking marker: the marker then always arrives in a plain step (or as a
        verify's own token, with nothing after it), so `on_thinking_closed` sees a context
        that ends with it."""
        proposal = super().propose(engine, seq, max_tokens)  # None without thinking speculation
        if proposal is None:
            return None
        tokens = proposal.tokens
        for i, token in enumerate(tokens):
            if token in self._end_token_ids:
                tokens = tokens[:i]
                break
        if not tokens:
            return None
        return Proposal(tokens, source=SSRStage.THINKING.value)  # deterministic: verified as a one-hot draft

    def _prefix_proposal(self, room: int) -> Proposal | None:
        """The verified draft's next run, from the cursor (chunked by the engine's cap)."""
        draft = self.verified_draft
        source = self.prefix_source
        start = self.prefix_cursor
        if start >= len(source):
            return None
        tokens = source[start : start + min(room, self._prefix_chunk)]
        probs = None
        if self.config.use_draft_probs and draft.probs:
            probs = self._draft_prob_rows(draft, start, len(tokens))
        return Proposal(tokens, probs, source=SSRStage.PREFIX.value)

    def _draft_prob_rows(self, draft: Draft, start: int, n: int) -> torch.Tensor:
        """q for each proposed token: one-hot on the forced anchor, the child's own rows after."""
        rows = []
        anchor = len(draft.anchor)
        vocab = draft.probs[0].shape[-1]
        for i in range(start, start + n):
            if i < anchor or i - anchor >= len(draft.probs):
                row = torch.zeros(vocab, device=draft.probs[0].device)
                row[self.prefix_source[i]] = 1.0
            else:
                row = draft.probs[i - anchor]
            rows.append(row)
        return torch.stack(rows)

    # ------------------------------------------------------------------ reacting
    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        source = outcome.proposal.source if outcome.proposal is not None else None
        new_tokens = list(outcome.committed)
        if source == SSRStage.THINKING.value:
            self.thinking_verify_steps += 1
        elif self.phase is Phase.ANSWER:
            self.answer_forwards += 1
            if source is not None:
                self.answer_verify_steps += 1
            if source == SSRStage.PREFIX.value:
                self._advance_prefix(outcome.accepted, outcome.proposed, new_tokens)
            elif source is None and self.stage is SSRStage.PREFIX:
                self._follow_plain_step(new_tokens)
            elif source == SSRStage.SUFFIX.value:
                self.suffix_accepted += outcome.accepted
                self._back_off(outcome.accepted)
        self._consume(engine, seq)
        if seq.is_finished or self.phase is not Phase.THINKING:
            return
        while self.budgets and self.metrics.cot_tokens >= self.budgets[0]:
            self.budgets.pop(0)
            self._fork(engine, seq)

    def _back_off(self, accepted: int) -> None:
        """Exponential back-off of suffix proposals while they keep failing (see SSRConfig)."""
        if accepted > 0 or self.config.suffix_backoff_max == 0:
            self._suffix_fail_streak = 0
            return
        self._suffix_fail_streak += 1
        self._suffix_skip = min(1 << min(self._suffix_fail_streak - 1, 20), self.config.suffix_backoff_max)

    def _follow_plain_step(self, new_tokens: list[int]) -> None:
        """A step without a proposal in the prefix stage (the engine feeds the forced end-of-thinking
        marker in a plain step, as plain decoding does): the model's own tokens move the cursor while
        they continue the draft; the first that does not ends the prefix stage."""
        source = self.prefix_source
        for token in new_tokens:
            if self.prefix_cursor < len(source) and token == source[self.prefix_cursor]:
                self.prefix_cursor += 1
            else:
                self._leave_prefix()
                return

    def _advance_prefix(self, accepted: int, proposed: int, new_tokens: list[int]) -> None:
        """Move the cursor over what the model agreed with; leave at the first disagreement."""
        source = self.prefix_source
        self.prefix_cursor += accepted
        if accepted < proposed:
            self._leave_prefix()
            return
        # Fully accepted: the draft is tracking the model, verify a longer run next time.
        self._prefix_chunk = min(self._prefix_chunk * 2, self.config.prefix_chunk_max)
        bonus_index = accepted
        if (
            bonus_index < len(new_tokens)
            and self.prefix_cursor < len(source)
            and new_tokens[bonus_index] == source[self.prefix_cursor]
        ):
            self.prefix_cursor += 1  # the model's own next token continues the draft
        else:
            self._leave_prefix()

    def on_thinking_closed(self, engine: "Engine", seq: "Sequence") -> None:
        """The parent's CoT is complete: stop drafting, set up verification."""
        for draft in self.drafts:
            if not draft.seq.is_finished:
                draft.cancelled = True
                engine.cancel(draft.seq, "parent ended thinking")
        self.budgets = []
        usable = [d for d in self.drafts if d.tokens]
        reuse = self.config.reuse
        if not usable or reuse == "off":
            self.stage = SSRStage.PLAIN
            return
        newest = usable[-1]
        self.verified_draft = newest
        self.prefix_source = newest.source  # frozen: the draft was cancelled or had finished
        if reuse in ("suffix", "prefix+suffix"):
            self.suffix_proposer = self._make_suffix_proposer(seq, usable)
        if reuse in ("prefix", "prefix+suffix"):
            self.prefix_cursor = self._align(seq.token_ids, newest.anchor)
            self.prefix_start = self.prefix_cursor
            self.stage = SSRStage.PREFIX
        else:
            self.stage = SSRStage.SUFFIX

    def _align(self, context: list[int], anchor: list[int]) -> int:
        """Where in (anchor + draft) the parent's context now stands.

        Closed by force: the context ends with the whole anchor. Closed by the model: it
        ends with an end marker, so the draft is proposed from just after the anchor's
        marker (e.g. the blank line, then the answer).
        """
        if context[-len(anchor) :] == anchor:
            return len(anchor)
        for variant in self.fmt.end_variants or (self.fmt.end_ids,):
            n = len(variant)
            for i in range(len(anchor) - n, -1, -1):
                if tuple(anchor[i : i + n]) == tuple(variant):
                    return i + n
        return len(anchor)

    def on_draft_finished(self, draft: Draft) -> None:
        """A draft ended (EOS, its length cap, or cancelled); nothing to do until thinking ends."""

    def on_finish(self, engine: "Engine", seq: "Sequence") -> None:
        super().on_finish(engine, seq)
        if engine is not None:
            for draft in self.drafts:
                if not draft.seq.is_finished:
                    engine.cancel(draft.seq, "parent finished")

    # ------------------------------------------------------------------ internals
    def _leave_prefix(self) -> None:
        if self.stage is not SSRStage.PREFIX:
            return
        self.accepted_prefix = self._prefix_matched()
        self.stage = SSRStage.SUFFIX if self.suffix_proposer is not None else SSRStage.PLAIN

    def _prefix_matched(self) -> int:
        """Draft answer tokens the model agreed with (anchor tokens not counted)."""
        anchor = len(self.verified_draft.anchor)
        return max(0, self.prefix_cursor - max(anchor, self.prefix_start))

    def _fork(self, engine: "Engine", seq: "Sequence") -> None:
        if self.config.cancel_older_drafts:
            for older in self.drafts:
                if not older.seq.is_finished:
                    older.cancelled = True
                    engine.cancel(older.seq, "superseded by a newer draft")
        params = SamplingParams(
            max_tokens=self.config.max_draft_len,
            temperature=seq.params.temperature,
            top_k=seq.params.top_k,
            top_p=seq.params.top_p,
            min_p=seq.params.min_p,
            seed=None if seq.params.seed is None else seq.params.seed + 7919 * (len(self.drafts) + 1),
            ignore_eos=seq.params.ignore_eos,
            stop_token_ids=list(seq.params.stop_token_ids),
        )
        anchor = list(self.fmt.close_ids)
        placeholder = Draft(index=len(self.drafts), cot_tokens=self.metrics.cot_tokens, seq=None, anchor=anchor)  # type: ignore[arg-type]
        policy = DraftPolicy(self, placeholder, list(self.drafts))
        child = engine.fork(seq, anchor, params=params, policy=policy)
        if child is None:
            self.fork_failures += 1
            return
        placeholder.seq = child
        child.record_probs = self.config.use_draft_probs and not params.greedy
        self.drafts.append(placeholder)

    def _make_suffix_proposer(self, seq: "Sequence", drafts: list[Draft]) -> SuffixProposer:
        sources = self.config.suffix_sources
        index_context = "prompt" in sources or "output" in sources
        proposer = SuffixProposer(
            self.config.suffix.to_config(index_context=index_context),
            global_history=self.global_history,
        )
        if "draft" in sources:
            for d in drafts:
                proposer.add_source(f"draft:{d.index}", d.source)
        return proposer

    # ------------------------------------------------------------------ metrics
    def report(self) -> dict:
        return {
            "drafts": len(self.drafts),
            "draft_tokens": sum(len(d.tokens) for d in self.drafts),
            "draft_forwards": sum(d.seq.stats.forwards for d in self.drafts),
            "draft_fork_cot": [d.cot_tokens for d in self.drafts],
            "fork_failures": self.fork_failures,
            "suffix_skipped_steps": self.suffix_skipped_steps,
            "thinking_verify_steps": self.thinking_verify_steps,
            # A bonus token cut by a cap never became an answer token.
            "accepted_prefix": min(
                self._prefix_matched() if self.stage is SSRStage.PREFIX else self.accepted_prefix,
                self.metrics.answer_tokens,
            ),
            "suffix_accepted_tokens": self.suffix_accepted,
            "answer_verify_steps": self.answer_verify_steps,
            "answer_forwards": self.answer_forwards,
            "mean_acceptance_length": (self.metrics.answer_tokens / self.answer_forwards)
            if self.answer_forwards
            else 0.0,
            "verified_draft": None if self.verified_draft is None else self.verified_draft.index,
        }
