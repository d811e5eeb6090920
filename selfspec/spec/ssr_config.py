"""Per-request SSR options, validated (they arrive from the CLI, the API and HTTP bodies).

Defaults are the paper's fixed-length row: draft budget 500, max draft 500, reuse
prefix+suffix, suffix depth / spec tokens / factor 4 / 16 / 4 over the draft only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from selfspec.spec.suffix import SuffixConfig

if TYPE_CHECKING:
    from selfspec.llm import LLM
    from selfspec.thinking.policy import ThinkingLimits

ReuseMode = Literal["off", "prefix", "suffix", "prefix+suffix"]
SuffixSource = Literal["draft", "prompt", "output", "global"]


class SuffixOptions(BaseModel):
    """SuffixDecoding knobs (see `selfspec.spec.suffix.SuffixConfig`)."""

    model_config = ConfigDict(extra="forbid")

    max_depth: int = Field(4, ge=2, le=256)
    max_spec_tokens: int = Field(16, ge=1, le=1024)
    spec_factor: float = Field(4.0, ge=0.0)
    spec_offset: float = Field(0.0, ge=0.0)
    min_token_prob: float = Field(0.0, ge=0.0, le=1.0)
    mode: Literal["tree", "longest_match"] = "tree"

    def to_config(self, *, index_context: bool = False) -> SuffixConfig:
        return SuffixConfig(
            max_depth=self.max_depth,
            max_spec_tokens=self.max_spec_tokens,
            spec_factor=self.spec_factor,
            spec_offset=self.spec_offset,
            min_token_prob=self.min_token_prob,
            mode=self.mode,
            index_context=index_context,
        )


class SSRConfig(BaseModel):
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
    suffix_backoff / suffix_backoff_max: after a suffix proposal of which nothing is accepted,
      skip the next 1, 2, 4, ... (at most `suffix_backoff_max`) answer steps before proposing
      again; an accepted token resets it. A draft that stopped tracking the answer then costs
      a few verifies instead of one per token (a k-token verify costs ~1.3 decode steps on
      the H200). It only decides when to propose, so outputs are unchanged. 0 disables it.
    """

    model_config = ConfigDict(extra="forbid")
    needs_thinking: ClassVar[bool] = True

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

    def build_policy(self, llm: "LLM", *, limits: "ThinkingLimits | None", thinking: bool, params=None):
        from selfspec.spec.ssr import SSRPolicy

        return SSRPolicy(self, llm.thinking_format, limits, thinking=thinking, global_history=getattr(llm, "global_history", None))
