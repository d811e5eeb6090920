"""Speculation without SSR: suffix decoding over prompt/output/history, or n-gram prompt lookup.

These are the baselines SSR is compared against in the same engine. They speculate in
both phases (thinking and answer) under the same thinking rules as every other mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from selfspec.thinking.policy import ThinkingPolicy
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.suffix import SuffixProposer
from selfspec.spec.ssr_config import SuffixOptions

if TYPE_CHECKING:
    from selfspec.llm import LLM
    from selfspec.thinking.policy import ThinkingLimits


class SpeculationConfig(BaseModel):
    """method="suffix": SuffixDecoding over the request's prompt + output (and the global
    history of past responses if "global" is in sources). method="ngram": prompt lookup.
    method="draft": draft-model speculation (SpS) with the LLM's draft model (`LLM(draft=...)`),
    K = num_speculative_tokens per round, verified exactly (greedy, or rejection sampling with
    the draft's probabilities)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["suffix", "ngram", "draft"] = "suffix"
    suffix: SuffixOptions = Field(default_factory=SuffixOptions)
    sources: list[Literal["prompt", "output", "global"]] = Field(default_factory=lambda: ["prompt", "output"])
    max_ngram: int = Field(3, ge=1, le=32)
    min_ngram: int = Field(1, ge=1, le=32)
    num_tokens: int = Field(10, ge=1, le=256)
    num_speculative_tokens: int = Field(5, ge=1, le=64)  # draft-model speculation: K per round

    def build_policy(self, llm: "LLM", *, limits: "ThinkingLimits | None", thinking: bool, params=None) -> ThinkingPolicy:
        if self.method == "draft":
            from selfspec.engine.sampling import SamplingParams, make_generator
            from selfspec.spec.draft_model import DraftModelProposer

            if getattr(llm, "draft_runner", None) is None:
                raise ValueError("method='draft' needs a draft model: LLM(..., draft='layers:N' or a model)")
            params = params or SamplingParams()
            seed = None if params.seed is None else params.seed + 104729
            generator = None if params.greedy else make_generator(seed, llm.engine.device)
            proposer = DraftModelProposer(
                llm.draft_runner, num_tokens=self.num_speculative_tokens, params=params, generator=generator
            )
        elif self.method == "ngram":
            proposer = NgramProposer(max_ngram=self.max_ngram, min_ngram=self.min_ngram, num_tokens=self.num_tokens)
        else:
            index_context = "prompt" in self.sources or "output" in self.sources
            history = getattr(llm, "global_history", None) if "global" in self.sources else None
            proposer = SuffixProposer(self.suffix.to_config(index_context=index_context), global_history=history)
        history = getattr(llm, "global_history", None) if "global" in self.sources else None
        return ThinkingPolicy(llm.thinking_format, limits, thinking=thinking, proposer=proposer, history=history)
