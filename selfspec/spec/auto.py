"""`method: auto`: the speculation a request gets when it names none, chosen per request and step.

What pays differs by request and by machine: copying from the prompt and the chain of thought
(prompt lookup) is nearly free on a GPU and pays wherever text repeats; a draft answer forked
from the partial CoT (SSR) pays only where the answer is long and the draft gets accepted, and
its extra row is cheap on a GPU, dear on a CPU and dear on a full batch. So auto decides:

- per request: a request that thinks runs SSR (`spec.ssr`, built from an `SSRConfig`, not a
  second implementation) with prompt lookup in the chain of thought, the cost gate on the
  drafts (`gate="cost"`: a draft is forked only where its row pays on the measured step
  costs, and cancelled when it stops paying), iterative drafting that stops once two drafts
  agree (`converge_tokens`), and in the answer the draft's prefix, then the draft's suffix
  index beside prompt lookup over prompt + CoT (the longer proposal wins). A request that
  does not think, whose answer is too short for a draft to pay, or whose drafts the cost gate
  would decline as it starts (this LLM's record of what drafts saved, the measured row cost),
  copies (prompt lookup): SSR's per-step work costs host time on every step, drafted or not.
  Every 16th such request drafts again, so the record follows a workload that changes.
- per step: how many tokens to propose (`spec.proposal_length`), from the engine's measured
  step costs at the current batch size and this request's recent acceptance; none when
  nothing pays, and never beyond a per-step budget of `max_step_ratio` decode steps, so a
  full batch falls back to plain decoding row by row.

Every path is lossless: it only decides what the engine's exact verifier is shown.
`result.metrics["auto"]` says what was chosen and why (path, fallback, proposal lengths,
tokens proposed and accepted per phase and source); the drafts' gate verdicts are in
`draft_gate` as for SSR.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from selfspec.engine.policy import Proposal, StepOutcome
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.draft_gate import drafts_cannot_pay
from selfspec.spec.longest import LongestProposer, thinking_proposer
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.proposal_length import LengthController
from selfspec.spec.ssr import SSRPolicy
from selfspec.spec.ssr_core import PREFIX_SOURCE, SUFFIX_SOURCE, THINKING_SOURCE, SSRConfig, SSRStage
from selfspec.spec.suffix import SuffixOptions
from selfspec.thinking.policy import Phase, ThinkingPolicy

if TYPE_CHECKING:
    from selfspec.engine.llm_engine import Engine
    from selfspec.engine.sequence import Sequence

__all__ = ["AutoConfig", "AutoLookupPolicy", "AutoSSRPolicy", "OffConfig"]

LOOKUP_TOKENS = 32
"""Prompt lookup's longest copy on the lookup path; the per-step length rule cuts it further."""


class AutoConfig(MethodConfig):
    """The default speculation: SSR on thinking requests, prompt lookup elsewhere, lengths
    chosen per step from measured costs (see the module docstring). Every knob has a default
    that is meant to be left alone.

    lookup: what copies on the lookup path and in the chain of thought: "ngram" (prompt lookup)
      or "longest" (the longer of prompt lookup and SuffixDecoding over the request's context:
      more host time per step, worth it where a step costs milliseconds).
    draft_interval / converge_tokens / max_draft_len: SSR's iterative drafting (a draft every
      `draft_interval` CoT tokens; a draft that agrees with the one before it on its first
      `converge_tokens` tokens is dropped at once and no more are forked).
    min_answer_tokens: a thinking request whose answer may be at most this long (answer cap or
      max_tokens) takes the lookup path: a draft cannot save more than the answer.
    acceptance_prior / prefix_acceptance_prior: the per-token acceptance assumed before a
      request's own proposals were verified (copies; the draft's prefix).
    margin: a proposal must promise this many times a plain step's tokens per unit cost.
    max_step_ratio: no proposal makes a step cost more than this many decode steps of the
      same batch (the per-step token budget).
    """

    method: Literal["auto"] = "auto"
    lookup: Literal["ngram", "longest"] = "ngram"
    draft_interval: int = Field(256, ge=1)
    converge_tokens: int = Field(16, ge=1)
    max_draft_len: int = Field(512, ge=1)
    min_answer_tokens: int = Field(32, ge=0)
    acceptance_prior: float = Field(0.6, gt=0.0, lt=1.0)
    prefix_acceptance_prior: float = Field(0.8, gt=0.0, lt=1.0)
    margin: float = Field(1.1, ge=1.0)
    max_step_ratio: float = Field(1.5, ge=1.0)

    def ssr_config(self) -> SSRConfig:
        """The SSR settings the thinking path runs with. No suffix back-off: each answer step's
        proposal length comes from the length rule, which proposes nothing where copies keep
        failing and everything where they run; skipping the steps after a miss on top of it
        costs an answer that copies its CoT the copies it would pick up again at once (without a
        draft, about half prompt lookup's tokens per forward on route finding, H100)."""
        return SSRConfig(
            suffix_backoff_max=0,
            draft_interval=self.draft_interval,
            max_draft_len=self.max_draft_len,
            speculate_thinking=True,
            thinking_speculator=self.lookup,
            gate="cost",
            converge_tokens=self.converge_tokens,
            converge_early=True,
            speculate_drafts=True,
        )

    def controller(self) -> LengthController:
        priors = {"thinking": self.acceptance_prior, "answer": self.acceptance_prior, "draft": self.acceptance_prior}
        priors["draft_prefix"] = self.prefix_acceptance_prior
        return LengthController(priors, margin=self.margin, max_step_ratio=self.max_step_ratio)

    def choose_path(self, ctx: MethodContext) -> tuple[str, str | None]:
        """("ssr" | "lookup", why the lookup path was taken where a thinking request could draft)."""
        fmt = ctx.thinking_format
        if not ctx.thinking or fmt is None or fmt.kind == "none":
            return "lookup", None
        answer_room = ctx.params.max_tokens
        if ctx.limits is not None and ctx.limits.answer_cap is not None:
            answer_room = min(answer_room, ctx.limits.answer_cap)
        if answer_room <= self.min_answer_tokens:
            return "lookup", f"answer of at most {answer_room} tokens: a draft cannot pay"
        declined = drafts_cannot_pay(self.ssr_config(), ctx.draft_acceptance, ctx.step_costs, ctx.rows)
        if declined is not None:
            # SSR's per-step work (the draft schedule's watch, the answer stages) costs host time on
            # every step whether or not a draft is forked: on an H100 running the 135M thinker,
            # 0.014 ms a step, about 1% of it. A request whose drafts the gate would decline now
            # copies instead, as a non-thinking request does; every EXPLORE_EVERY-th drafts again.
            return "lookup", f"the gate declines drafts here: {declined.reason}"
        return "ssr", None

    def build(self, ctx: MethodContext) -> ThinkingPolicy:
        path, why = self.choose_path(ctx)
        if path == "ssr":
            return AutoSSRPolicy(self, ctx)
        return AutoLookupPolicy(self, ctx, fallback=why)


def _rows(engine: "Engine") -> int:
    """Rows the engine runs this step (drafts included: each is a row the step pays for)."""
    return max(1, engine.num_running)


def proposer_capacity(proposer) -> int | None:
    """The most tokens `proposer` ever offers in one proposal (prompt lookup's `num_tokens`; the
    longest of a `LongestProposer`'s children), None where unbounded or unknown: no length beyond
    it is worth pricing, and pricing fewer lengths keeps the per-step decision cheap."""
    if isinstance(proposer, NgramProposer):
        return proposer.num_tokens
    if isinstance(proposer, LongestProposer):
        caps = [proposer_capacity(child) for child in proposer.proposers]
        return None if any(c is None for c in caps) else max(caps, default=0)
    return None


def _capped(room: int, capacity: int | None) -> int:
    return room if capacity is None else min(room, capacity)


def _lookup_proposer(kind: str):
    if kind == "longest":
        return thinking_proposer("longest", SuffixOptions().to_config(index_context=True))
    return NgramProposer(num_tokens=LOOKUP_TOKENS)


class AutoLookupPolicy(ThinkingPolicy):
    """The copy path: prompt lookup (or the longer of it and SuffixDecoding) in both phases,
    under the thinking rules, with the per-step length rule."""

    def __init__(self, config: AutoConfig, ctx: MethodContext, fallback: str | None = None) -> None:
        super().__init__(
            ctx.thinking_format, ctx.limits, thinking=ctx.thinking, proposer=_lookup_proposer(config.lookup)
        )
        self.config = config
        self.lengths = config.controller()
        self.fallback = fallback
        self._capacity = proposer_capacity(self.proposer)
        self._tail: list[int] | tuple = ()  # the latest copy's tokens beyond the chosen length

    def _kind(self) -> str:
        return "thinking" if self.phase is Phase.THINKING else "answer"

    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        room = self._proposal_room(max_tokens)
        if room <= 0:
            return None
        # The copy first, then its length: a step with nothing to copy makes no length decision,
        # and no length beyond what the copy offers is priced.
        tokens = self.proposer.propose(seq.token_ids, _capped(room, self._capacity)).tokens
        if not tokens:
            return None
        kind = self._kind()
        k = self.lengths.choose(kind, engine.step_costs, _rows(engine), len(tokens))
        self._tail = tokens[k:] if 0 < k < len(tokens) else ()
        return Proposal(tokens[:k], source=kind) if k > 0 else None

    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        lengths, phase = self.lengths, self.phase
        lengths.follow(outcome.committed)
        if outcome.proposal is not None and outcome.proposal.source is not None:
            kind = outcome.proposal.source
            lengths.record(kind, kind, "lookup", outcome.proposed, outcome.accepted, self._tail, outcome.committed)
        super().on_step(engine, seq, outcome)
        if self.phase is not phase:  # forced or closing tokens: later commits no longer follow the copy
            lengths.drop_tail()

    def report(self) -> dict:
        return {"auto": {"path": "lookup", "fallback": self.fallback, **self.lengths.report()}}


class AutoSSRPolicy(SSRPolicy):
    """The drafting path: SSR with auto's settings, each step's proposal cut to the length the
    measured costs and this request's acceptance pay for."""

    def __init__(self, config: AutoConfig, ctx: MethodContext) -> None:
        super().__init__(
            config.ssr_config(),
            ctx.thinking_format,
            ctx.limits,
            thinking=ctx.thinking,
            global_history=ctx.global_history,
            acceptance=ctx.draft_acceptance,
        )
        self.auto = config
        self.lengths = config.controller()
        self._answer_source = "lookup"  # what the last answer-stage proposal came from
        self._thinking_capacity = proposer_capacity(self.proposer)  # the CoT's copies never offer more
        self._fed = 1  # tokens this request fed in its latest step (1 + its proposal): what its drafts may match
        self._tail: list[int] | tuple = ()  # the latest offer's tokens beyond the chosen length

    def _kind(self) -> str:
        if self.phase is not Phase.ANSWER:
            return "thinking"
        return "draft_prefix" if self.answer.stage is SSRStage.PREFIX else "answer"

    def propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        self._tail = ()
        proposal = self._propose(engine, seq, max_tokens)
        self._fed = 1 + (len(proposal.tokens) if proposal is not None else 0)
        return proposal

    def _propose(self, engine: "Engine", seq: "Sequence", max_tokens: int) -> Proposal | None:
        if self.phase is not Phase.ANSWER:
            # The CoT's copy first, then its length (as on the lookup path). Every CoT step runs this:
            # the copy is asked for directly and one proposal is built (the thinking steps' host time
            # is where auto has trailed prompt lookup).
            tokens = self._thinking_tokens(seq, _capped(max_tokens, self._thinking_capacity))
            if tokens is None:
                return None
            k = self.lengths.choose("thinking", engine.step_costs, _rows(engine), len(tokens))
            if k == 0:
                return None
            if k >= len(tokens):
                return Proposal(tokens, source=THINKING_SOURCE)
            self._tail = tokens[k:]
            return Proposal(tokens[:k], source=THINKING_SOURCE)
        # The answer's offer first (the draft's next run, or the longer copy), then its length, as
        # in the chain of thought: the length rule prices only the positions the offer has (pricing
        # every length up to the engine's room rebuilt the acceptance of 63 positions after every
        # verified answer step), and no length is chosen on a step with nothing to offer.
        suffix = self.answer.suffix_proposer
        before = list(suffix.chosen_counts) if isinstance(suffix, LongestProposer) else None
        proposal = super().propose(engine, seq, max_tokens)
        if proposal is None or not proposal.tokens:
            return None
        kind = "draft_prefix" if proposal.source == PREFIX_SOURCE else "answer"
        k = self.lengths.choose(kind, engine.step_costs, _rows(engine), len(proposal.tokens))
        if k == 0:
            return None
        if proposal.source == SUFFIX_SOURCE:
            # The answer's copy stage: the longer of prompt lookup (child 0) and the drafts' index.
            chose_draft = before is not None and suffix.chosen_counts[1] > before[1]
            self._answer_source = "draft_suffix" if chose_draft else "lookup"
        if k < len(proposal.tokens):
            self._tail = proposal.tokens[k:]  # heard as the whole offer once the verifier settles it
            probs = proposal.draft_probs[:k] if proposal.draft_probs is not None else None
            proposal = Proposal(proposal.tokens[:k], probs, proposal.source)
        return proposal

    def draft_proposal_room(self, engine: "Engine", max_tokens: int) -> int:
        """A draft child's own proposal is a verify in the parent's steps: sized by the same rule
        as the parent's, from the drafts' own acceptance (a draft copying the CoT accepts much,
        one guessing does not), so where long verifies are dear (a CPU) the draft decodes plainly.
        And never wider than the parent's own row (its padded bucket, where steps are padded): the
        rows of a step are padded to its widest, so a draft verifying 64 tokens beside a parent
        verifying 8 makes the parent's step a 64-token one. The draft needs only to keep pace with
        the parent, which a row as wide as the parent's does; a wider one bills the parent (on an
        H100, with drafts verifying up to 63 tokens, auto's forwards on arithmetic search took
        8.6% more GPU time than prompt lookup's, for 2% fewer of them)."""
        costs = engine.step_costs
        room = min(max_tokens, self._draft_width(costs) - 1)
        if room <= 0:
            return 0
        return self.lengths.choose("draft", costs, _rows(engine), room)

    def _draft_width(self, costs) -> int:
        """The widest row a draft may feed this step: the parent's latest row, up to its bucket."""
        bucket = costs.bucket(self._fed) if costs is not None and costs.padded else None
        return bucket if bucket is not None else self._fed

    def on_draft_step(self, outcome: StepOutcome) -> None:
        self.lengths.record("draft", "thinking", "draft_own", outcome.proposed, outcome.accepted)

    def on_step(self, engine: "Engine", seq: "Sequence", outcome: StepOutcome) -> None:
        proposal, lengths, phase = outcome.proposal, self.lengths, self.phase
        lengths.follow(outcome.committed)
        if proposal is not None and proposal.source is not None:
            source = proposal.source
            if source == THINKING_SOURCE:
                lengths.record(
                    "thinking", "thinking", "lookup", outcome.proposed, outcome.accepted, self._tail, outcome.committed
                )
            elif source == PREFIX_SOURCE:
                lengths.record(
                    "draft_prefix",
                    "answer",
                    "draft_prefix",
                    outcome.proposed,
                    outcome.accepted,
                    self._tail,
                    outcome.committed,
                )
            else:
                lengths.record(
                    "answer",
                    "answer",
                    self._answer_source,
                    outcome.proposed,
                    outcome.accepted,
                    self._tail,
                    outcome.committed,
                )
        super().on_step(engine, seq, outcome)
        if self.phase is not phase:  # the CoT closed (or was closed): later commits no longer follow its copy
            lengths.drop_tail()

    def report(self) -> dict:
        out = super().report()
        gate = out.get("draft_gate") or []
        out["auto"] = {
            "path": "ssr",
            "fallback": None,
            "drafts_forked": out.get("drafts", 0),
            "drafts_declined": sum(1 for v in gate if v["action"] in ("skip", "cancel")),
            **self.lengths.report(),
        }
        return out


class OffConfig(MethodConfig):
    """`method: off`: no speculation, plain decoding under the thinking rules (what a request gets
    with speculation turned off where auto is the default)."""

    method: Literal["off"] = "off"

    def build(self, ctx: MethodContext) -> ThinkingPolicy:
        return ThinkingPolicy(ctx.thinking_format, ctx.limits, thinking=ctx.thinking)
