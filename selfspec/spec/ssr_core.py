"""SSR's policy, independent of the engine that runs it: when to fork, what to cancel, what to
propose from the drafts, and how verdicts move it.

Two backends run SSR: this package's engine (`selfspec.spec.ssr`, drafts are forked sequences)
and vLLM (`selfspec.integrations.vllm`, drafts are child requests served from the prefix
cache). Both must make the same decisions, so the decisions live here once:

- `Draft` and `DraftBackend`: one fork, and what a backend does for drafting (fork, cancel,
  is-running), which each backend implements; `spec.draft_schedule.DraftSchedule` decides when.
- `AnswerSpeculator`: the answer stages (prefix verification of the newest draft, then
  draft-backed suffix decoding, then plain). It sees only token lists and verdicts, so the
  engine's policy and vLLM's proposer feed it the same way.
- `draft_proposer`: what a draft child speculates from (earlier drafts, iterative drafting).

Nothing here touches a model or a KV cache: every token either backend commits still goes
through that backend's exact verifier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Literal, Protocol, Sequence

import torch
from pydantic import Field, model_validator

from selfspec.engine.policy import Proposal
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.longest import LongestProposer, ThinkingSpeculator, thinking_proposer
from selfspec.spec.suffix import GlobalSuffixHistory, SuffixConfig, SuffixOptions, SuffixProposer

ReuseMode = Literal["off", "prefix", "suffix", "prefix+suffix"]
SuffixSource = Literal["draft", "prompt", "output", "global"]


class SSRStage(str, Enum):
    """The parent's speculation stage: drafting while it thinks, then verifying the draft's
    prefix, then draft-backed suffix decoding, then plain decoding once no source helps."""

    THINKING = "thinking"
    PREFIX = "prefix"
    SUFFIX = "suffix"
    PLAIN = "plain"


# A proposal's source per stage, read once: an enum's `.value` is a property call, and these are
# set and compared on every step.
THINKING_SOURCE = SSRStage.THINKING.value
PREFIX_SOURCE = SSRStage.PREFIX.value
SUFFIX_SOURCE = SSRStage.SUFFIX.value


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
    speculate_thinking: the parent also speculates its chain of thought over its prompt and
      output (as the suffix-decoding and prompt-lookup peers do): thinking models copy the task
      into their CoT and the CoT into the answer, so many CoT tokens come free while the draft
      runs; the same proposer keeps proposing in the answer (beside the draft-backed suffix
      stage, and alone where no draft is usable). Proposals stop before any end-of-thinking
      token, so thinking is always closed by a plain step and the draft verification starts
      aligned.
    thinking_speculator: what speculates the CoT (and a draft's own context) under
      `speculate_thinking`: "suffix" (SuffixDecoding), "ngram" (prompt lookup) or "longest"
      (both, the longer candidate each step: `spec.longest`).
    converge_tokens: iterative drafting stops forking once the two newest drafts agree on their
      first `converge_tokens` tokens: the answer has settled in the CoT, so a later draft would
      cost rows and say the same (the newest runs on). None: fork at every budget.
    converge_early: with `converge_tokens`, a running draft that agrees with the draft before it
      on its first `converge_tokens` tokens is cancelled at once and dropped, and the older,
      complete draft is the one verified: the agreement is the sign the answer has settled, so the
      rest of the newer draft would mostly repeat the older one at a row per step.
    gate: "always" forks at every budget (the paper's fixed budgets); "cost" forks only where the
      draft can pay on the device and load it runs on, judged from the engine's measured step
      costs (`spec.draft_gate`): it skips or cancels drafts whose extra row costs more than the
      draft can save, and says so in the request's metrics (`draft_gate`).
    gate_acceptance: the gate's prior for the fraction of draft tokens the model accepts; the
      LLM's measured acceptance on earlier requests takes over as drafts are verified.
    gate_margin: how much the expected saving must exceed the measured cost.
    gate_probe_steps: a running draft is re-judged every this many of its tokens (the first
      time once the extra row is measured); two failing checks in a row cancel it.
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
    thinking_speculator: ThinkingSpeculator = "suffix"
    converge_tokens: int | None = Field(None, ge=1)
    converge_early: bool = False
    gate: Literal["always", "cost"] = "always"
    gate_acceptance: float = Field(0.5, gt=0.0, le=1.0)
    gate_margin: float = Field(1.25, ge=0.0)
    gate_probe_steps: int = Field(16, ge=1)

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

    def build(self, ctx: MethodContext):
        # The engine's policy lives beside the engine; imported here so this module stays
        # importable where only the policy (not the engine's SSR hooks) is needed.
        from selfspec.spec.ssr import SSRPolicy

        return SSRPolicy(
            self,
            ctx.thinking_format,
            ctx.limits,
            thinking=ctx.thinking,
            global_history=ctx.global_history,
            acceptance=ctx.draft_acceptance,
        )


# Prefix verification proposes whole draft runs; the engine splits them into chunks of
# its `max_proposal_tokens`, so the cap here only needs to exceed that.
_UNCAPPED = SuffixConfig(
    mode="longest_match", max_spec_tokens=1 << 16, spec_factor=float(1 << 16), spec_offset=float(1 << 16)
)


@dataclass
class Draft:
    """One fork: the CoT length it saw, the backend's handle on it, and the answer it wrote.

    `seq` is whatever the backend forked (the engine's `Sequence`, a vLLM request id): the
    policy only passes it back to the backend."""

    index: int
    cot_tokens: int
    seq: Any
    anchor: list[int]  # the end-of-thinking tokens appended at the fork
    tokens: list[int] = field(default_factory=list)
    probs: list = field(default_factory=list)  # per draft token, when the request samples with draft probs
    cancelled: bool = False
    dropped: bool = False  # cancelled as a repeat of the draft before it (`converge_early`): never verified

    @property
    def source(self) -> list[int]:
        """Anchor + draft answer: what the parent's answer is matched against."""
        return self.anchor + self.tokens


class DraftBackend(Protocol):
    """What a backend does for SSR's drafting (the engine: fork/cancel a sequence; vLLM: submit
    /abort a child request). `fork_draft` returns the handle stored in `Draft.seq`, None when
    the backend refuses (no room). `step_costs` gives the measured step costs, the number of
    decode rows now running that are no draft and how many other requests' drafts run beside
    them (None where the backend measures none, or a backend without the method: the cost gate
    then always forks)."""

    def fork_draft(self, draft: Draft, earlier: list[Draft]) -> Any | None: ...

    def cancel_draft(self, draft: Draft, reason: str) -> None: ...

    def draft_running(self, draft: Draft) -> bool: ...

    def step_costs(self) -> "tuple[Any, int, int] | None": ...


def draft_proposer(config: SSRConfig, earlier: list[Draft], context_proposer=None):
    """What a new draft speculates from: earlier drafts (they mostly agree, so a later draft
    costs fewer steps), or its own context with thinking speculation (the answer copies the
    CoT). None: the draft decodes plainly. `context_proposer`, the parent's CoT proposer, is
    forked where it can be (`NgramProposer.fork`): the draft's context starts with what it indexed."""
    usable = [d for d in earlier if d.tokens] if config.speculate_drafts else []
    proposer = None
    if config.speculate_thinking:
        fork = getattr(context_proposer, "fork", None)
        proposer = (
            fork()
            if fork is not None
            else thinking_proposer(config.thinking_speculator, config.suffix.to_config(index_context=True))
        )
        if usable and not hasattr(proposer, "add_source"):  # prompt lookup alone indexes no extra sources
            proposer = LongestProposer([proposer, SuffixProposer(_UNCAPPED)])
    elif usable:
        proposer = SuffixProposer(_UNCAPPED)
    for d in usable:
        proposer.add_source(f"draft:{d.index}", d.source)
    return proposer


def cut_before_end(tokens: Sequence[int], context: Sequence[int], end_variants: Sequence[Sequence[int]]) -> list[int]:
    """A CoT proposal cut before the token that would complete an end-of-thinking marker (any of
    `end_variants`, counting marker tokens already at the end of `context`): the marker then
    always completes in a plain step or as a verify's own token, with nothing after it, so the
    close of thinking sees a context that ends with it. Only the completing token cuts: a
    marker of several tokens ("</", "think", ">") shares them with ordinary text (newlines, "->"),
    and cutting at any of them would cut most proposals of a chain of thought short. Runs on
    every CoT proposal: only a token that ends some variant is looked at further."""
    out = list(tokens)
    for i, token in enumerate(out):
        for variant in end_variants:
            if not variant or variant[-1] != token:
                continue
            n = len(variant)
            before = n - 1  # the variant's tokens before this one: from the proposal, then the context
            inside = min(before, i)
            if tuple(out[i - inside : i]) != tuple(variant[before - inside : before]):
                continue
            rest = before - inside
            if rest == 0 or (len(context) >= rest and tuple(context[len(context) - rest :]) == tuple(variant[:rest])):
                return out[:i]
    return out


class AnswerSpeculator:
    """The answer phase: prefix verification of the newest draft, then draft-backed suffix
    decoding, with back-off while suffix proposals fail.

    `end_variants` are the tokenizations of the end-of-thinking marker (aligning a context that
    the model closed itself with the draft's anchor). `context_proposer` is the proposer that
    speculated the chain of thought (thinking speculation), already indexed over the context: past
    the draft it proposes beside the draft-backed suffix stage (the longer candidate wins), and
    without a usable draft (none forked, the gate declined, all cancelled empty) the answer is
    speculated with it alone, so SSR composed with a peer never answers slower than that peer."""

    def __init__(
        self,
        config: SSRConfig,
        end_variants: Sequence[Sequence[int]],
        global_history: GlobalSuffixHistory | None = None,
        context_proposer=None,
    ) -> None:
        self.config = config
        self.context_proposer = context_proposer
        self.end_variants = [tuple(v) for v in end_variants]
        self.global_history = global_history if "global" in config.suffix_sources else None
        self.stage = SSRStage.THINKING
        self.suffix_proposer: SuffixProposer | None = None
        self.verified_draft: Draft | None = None
        self.accepted_prefix = 0
        self.suffix_accepted = 0
        self.answer_verify_steps = 0
        self.answer_forwards = 0
        self.suffix_skipped_steps = 0
        self.prefix_cursor = 0
        self.prefix_start = 0
        self.prefix_source: list[int] = []
        self._prefix_chunk = config.prefix_chunk_start
        self._suffix_fail_streak = 0  # consecutive suffix proposals with nothing accepted
        self._suffix_skip = 0  # answer steps left before the next suffix proposal

    # ------------------------------------------------------------------ start
    def start(self, context: list[int], drafts: list[Draft]) -> None:
        """Thinking is closed and `context` ends with the close: pick the newest draft, set the
        stage. `drafts` are the usable ones (with tokens), oldest first."""
        reuse = self.config.reuse
        if not drafts or reuse == "off":
            self.suffix_proposer = self.context_proposer
            self.stage = SSRStage.SUFFIX if self.suffix_proposer is not None else SSRStage.PLAIN
            return
        newest = drafts[-1]
        self.verified_draft = newest
        self.prefix_source = newest.source  # frozen: the draft was cancelled or had finished
        if reuse in ("suffix", "prefix+suffix"):
            self.suffix_proposer = self._make_suffix_proposer(drafts)
            sources = self.config.suffix_sources
            indexed = "prompt" in sources or "output" in sources
            if self.context_proposer is not None and not (self.config.thinking_speculator == "suffix" and indexed):
                # A SuffixDecoding CoT speculator adds nothing where the draft-backed index already
                # covers prompt + output; otherwise (prompt lookup) it proposes beside it.
                self.suffix_proposer = LongestProposer([self.context_proposer, self.suffix_proposer])
        else:
            self.suffix_proposer = self.context_proposer
        if reuse in ("prefix", "prefix+suffix"):
            self.prefix_cursor = self._align(context, newest.anchor)
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
        for variant in self.end_variants:
            n = len(variant)
            for i in range(len(anchor) - n, -1, -1):
                if tuple(anchor[i : i + n]) == variant:
                    return i + n
        return len(anchor)

    def _make_suffix_proposer(self, drafts: list[Draft]):
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

    # ------------------------------------------------------------------ proposing
    def propose(self, context: Sequence[int], room: int) -> Proposal | None:
        """Tokens to verify after the pending token, at most `room` (None: a plain step)."""
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
            proposal = self.suffix_proposer.propose(context, room)
            if proposal.tokens:
                return Proposal(proposal.tokens, source=SUFFIX_SOURCE)
        return None

    def _prefix_proposal(self, room: int) -> Proposal | None:
        """The verified draft's next run, from the cursor (chunked by the backend's cap)."""
        draft = self.verified_draft
        source = self.prefix_source
        start = self.prefix_cursor
        if start >= len(source):
            return None
        tokens = source[start : start + min(room, self._prefix_chunk)]
        probs = None
        if self.config.use_draft_probs and draft.probs:
            probs = self._draft_prob_rows(draft, start, len(tokens))
        return Proposal(tokens, probs, source=PREFIX_SOURCE)

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
    def on_verdict(self, source: str | None, accepted: int, proposed: int, new_tokens: list[int]) -> None:
        """One answer step: what was proposed (`source` None: a plain step), how much of it was
        accepted, and the tokens committed (accepted prefix + the verifier's own token)."""
        self.answer_forwards += 1
        if source is not None:
            self.answer_verify_steps += 1
        if source == PREFIX_SOURCE:
            self._advance_prefix(accepted, proposed, new_tokens)
        elif source is None and self.stage is SSRStage.PREFIX:
            self.follow(new_tokens)
        elif source == SUFFIX_SOURCE:
            self.suffix_accepted += accepted
            self._back_off(accepted)

    def follow(self, new_tokens: Sequence[int]) -> None:
        """Tokens committed without a proposal in the prefix stage (the forced end-of-thinking
        marker in a plain step, as plain decoding feeds it; a backend that starts the answer
        late): they move the cursor while they continue the draft; the first that does not ends
        the prefix stage."""
        source = self.prefix_source
        for token in new_tokens:
            if self.stage is not SSRStage.PREFIX:
                return
            if self.prefix_cursor < len(source) and token == source[self.prefix_cursor]:
                self.prefix_cursor += 1
            else:
                self._leave_prefix()
                return

    def _back_off(self, accepted: int) -> None:
        """Exponential back-off of suffix proposals while they keep failing (see SSRConfig)."""
        if accepted > 0 or self.config.suffix_backoff_max == 0:
            self._suffix_fail_streak = 0
            return
        self._suffix_fail_streak += 1
        self._suffix_skip = min(1 << min(self._suffix_fail_streak - 1, 20), self.config.suffix_backoff_max)

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

    def _leave_prefix(self) -> None:
        if self.stage is not SSRStage.PREFIX:
            return
        self.accepted_prefix = self._prefix_matched()
        self.stage = SSRStage.SUFFIX if self.suffix_proposer is not None else SSRStage.PLAIN

    def _prefix_matched(self) -> int:
        """Draft answer tokens the model agreed with (anchor tokens not counted)."""
        anchor = len(self.verified_draft.anchor)
        return max(0, self.prefix_cursor - max(anchor, self.prefix_start))

    # ------------------------------------------------------------------ metrics
    def matched_prefix(self) -> int:
        """Draft tokens the answer has taken in the prefix stage so far: `accepted_prefix` is set
        only when the stage is left, and an answer that ends inside the draft never leaves it."""
        return self._prefix_matched() if self.stage is SSRStage.PREFIX else self.accepted_prefix

    def taken_from_drafts(self, answer_tokens: int) -> int:
        """Answer tokens the drafts gave: the matched prefix (at most the answer: a bonus token cut by
        a cap never became one) and the suffix stage's accepted tokens."""
        return min(self.matched_prefix(), answer_tokens) + self.suffix_accepted

    def report(self, answer_tokens: int) -> dict:
        """The answer-phase metrics; `answer_tokens` caps the accepted prefix (a bonus token cut
        by a cap never became an answer token)."""
        return {
            "suffix_skipped_steps": self.suffix_skipped_steps,
            "accepted_prefix": min(self.matched_prefix(), answer_tokens),
            "suffix_accepted_tokens": self.suffix_accepted,
            "answer_verify_steps": self.answer_verify_steps,
            "answer_forwards": self.answer_forwards,
            "mean_acceptance_length": (answer_tokens / self.answer_forwards) if self.answer_forwards else 0.0,
            "verified_draft": None if self.verified_draft is None else self.verified_draft.index,
        }
