"""Speculation without SSR: suffix decoding over prompt/output/history, or n-gram prompt lookup.

These are the baselines SSR is compared against in the same engine. They speculate in
both phases (thinking and answer) under the same thinking rules as every other mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from selfspec.policies.thinking import ThinkingPolicy
from selfspec.spec.ngram_proposer import NgramProposer
from selfspec.spec.suffix_proposer import SuffixProposer
from selfspec.ssr.config import SuffixOptions

if TYPE_CHECKING:
    from selfspec.llm import LLM
    from selfspec.policies.thinking import ThinkingLimits


class SpeculationConfig(BaseModel):
    """method="suffix": SuffixDecoding over the request's prompt + output (and the global
    history of past responses if "global" is in sources). method="ngram": prompt lookup."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["suffix", "ngram"] = "suffix"
    suffix: SuffixOptions = Field(default_factory=SuffixOptions)
    sources: list[Literal["prompt", "output", "global"]] = Field(default_factory=lambda: ["prompt", "output"])
    max_ngram: int = Field(3, ge=1, le=32)
    min_ngram: int = Field(1, ge=1, le=32)
    num_tokens: int = Field(10, ge=1, le=256)

    def build_policy(self, llm: "LLM", *, limits: "ThinkingLimits | None", thinking: bool) -> ThinkingPolicy:
        if self.method == "ngram":
            proposer = NgramProposer(max_ngram=self.max_ngram, min_ngram=self.min_ngram, num_tokens=self.num_tokens)
        else:
            index_context = "prompt" in self.sources or "output" in self.sources
            history = getattr(llm, "global_history", None) if "global" in self.sources else None
            proposer = SuffixProposer(self.suffix.to_config(index_context=index_context), global_history=history)
        history = getattr(llm, "global_history", None) if "global" in self.sources else None
        return ThinkingPolicy(llm.thinking_format, limits, thinking=thinking, proposer=proposer, history=history)
