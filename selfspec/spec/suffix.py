"""Suffix decoding: a `Proposer` over per-request sources plus an optional shared history, and
the `SuffixDecodingConfig` method that speculates a request's CoT and answer with it.

The per-request `SuffixIndex` holds what this request may copy from (SSR: its drafts;
classic suffix decoding: its prompt and output, `index_context=True`). A
`GlobalSuffixHistory` shared by all requests holds past responses, bounded so a
long-running server does not grow without limit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable, Iterable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from selfspec.engine.policy import Proposal
from selfspec.spec.base import MethodConfig, MethodContext
from selfspec.spec.suffix_index import (
    Candidate,
    CountsTree,
    IndexMode,
    MatchSelection,
    SpeculationLimits,
    SuffixIndex,
)
from selfspec.thinking.policy import ThinkingPolicy

GLOBAL_SOURCE = "global"
"""`Candidate.source` of a proposal that came from the shared history."""


@dataclass(frozen=True)
class SuffixConfig:
    """Knobs of suffix speculation; the defaults are the SSR paper's row (4/16/4).

    max_depth: tree depth, which caps match length + proposal length ("tree" mode
        only; depth 4 proposes at most 3 tokens a step). "longest_match" has no cap.
    max_spec_tokens, spec_factor, spec_offset: a match of length m proposes at most
        `min(max_spec_tokens, m * spec_factor + spec_offset)` tokens.
    min_token_prob: stop a tree proposal once the path probability (product of
        child/parent counts) falls below it. 0.0 means "never stop early": the SSR
        row sets no threshold (vLLM's suffix method defaults to 0.1). Unused by
        "longest_match", whose single contiguous source has no counts to estimate from.
    mode: "tree" (SuffixDecoding's counts tree over all sources) or "longest_match"
        (one contiguous source at a time, unbounded match and run).
    select: which tree match to propose from: "score" (highest expected accepted
        tokens, ties to the longer match; ArcticInference) or "longest".
    index_context: also index the request's own context (prompt + output) as a
        source, grown automatically on every `propose`.
    """

    max_depth: int = 4
    max_spec_tokens: int = 16
    spec_factor: float = 4.0
    spec_offset: float = 0.0
    min_token_prob: float = 0.0
    mode: IndexMode = "tree"
    select: MatchSelection = "score"
    index_context: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ("tree", "longest_match"):
            raise ValueError(f"mode must be 'tree' or 'longest_match', got {self.mode!r}")
        if self.select not in ("score", "longest"):
            raise ValueError(f"select must be 'score' or 'longest', got {self.select!r}")
        if self.max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        if self.max_spec_tokens < 0 or not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError("max_spec_tokens must be >= 0 and min_token_prob in [0, 1]")

    @property
    def limits(self) -> SpeculationLimits:
        return SpeculationLimits(self.max_spec_tokens, self.spec_factor, self.spec_offset, self.min_token_prob)


class GlobalSuffixHistory:
    """Past responses of all requests in one counts tree, bounded FIFO.

    Bounds: at most `max_responses` responses and `max_tokens` tokens in total
    (None = unbounded). The oldest responses are evicted first and their counts
    subtracted exactly. The response just added or extended is evicted last: only
    when it alone exceeds `max_tokens`, after which further extensions of it are
    ignored (`extend_response` returns False). Not thread-safe: call it from the
    engine loop.
    """

    def __init__(self, max_depth: int = 4, max_responses: int | None = 256, max_tokens: int | None = None) -> None:
        if max_responses is not None and max_responses < 1:
            raise ValueError("max_responses must be >= 1 or None")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be >= 1 or None")
        self.max_responses = max_responses
        self.max_tokens = max_tokens
        self._tree = CountsTree(max_depth)
        self._names: OrderedDict[Hashable, str] = OrderedDict()  # insertion order = age
        self._next_id = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._names

    def __len__(self) -> int:
        return len(self._names)

    @property
    def keys(self) -> list[Hashable]:
        return list(self._names)

    @property
    def total_tokens(self) -> int:
        return self._tree.total_tokens

    @property
    def tree(self) -> CountsTree:
        return self._tree

    def add_response(self, key: Hashable, tokens: Iterable[int] = ()) -> None:
        """Start caching a response (replacing any cached one under the same key)."""
        if key in self._names:
            self.remove_response(key)
        name = f"r{self._next_id}"
        self._next_id += 1
        self._names[key] = name
        self._tree.add(name, tokens)
        self._evict(keep=key)

    def extend_response(self, key: Hashable, tokens: Iterable[int]) -> bool:
        """Append generated tokens; False if the response is not (or no longer) cached."""
        name = self._names.get(key)
        if name is None:
            return False
        self._tree.extend(name, tokens)
        self._evict(keep=key)
        return key in self._names

    def remove_response(self, key: Hashable) -> bool:
        name = self._names.pop(key, None)
        if name is None:
            return False
        self._tree.remove(name)
        return True

    def speculate(
        self, context: Sequence[int], limits: SpeculationLimits, max_tokens: int, select: MatchSelection = "score"
    ) -> Candidate | None:
        candidate = self._tree.speculate(context, limits, max_tokens, select)
        if candidate is not None:
            candidate.source = GLOBAL_SOURCE
        return candidate

    def _over_budget(self) -> bool:
        too_many = self.max_responses is not None and len(self._names) > self.max_responses
        too_long = self.max_tokens is not None and self._tree.total_tokens > self.max_tokens
        return too_many or too_long

    def _evict(self, keep: Hashable) -> None:
        while self._over_budget():
            victim = next((k for k in self._names if k != keep), keep)
            self.remove_response(victim)


class SuffixProposer:
    """`Proposer` over one request's `SuffixIndex`, optionally consulting a shared history.

    Tree mode compares the request's candidate with the history's and keeps the
    higher score (as ArcticInference does with its local and global trees).
    Longest-match mode asks the history (a counts tree) only when its own sources
    propose nothing: a contiguous match has no comparable score.
    """

    def __init__(self, config: SuffixConfig | None = None, global_history: GlobalSuffixHistory | None = None) -> None:
        self.config = config or SuffixConfig()
        self.index = SuffixIndex(self.config.mode, self.config.max_depth, self.config.index_context)
        self.global_history = global_history
        self._limits = self.config.limits
        self.last_candidate: Candidate | None = None
        """The candidate behind the last proposal (match length, score, source), for metrics."""

    @property
    def mode(self) -> IndexMode:
        return self.config.mode

    def add_source(self, name: str, tokens: Iterable[int] = ()) -> None:
        self.index.add_source(name, tokens)

    def extend_source(self, name: str, tokens: Iterable[int]) -> None:
        self.index.extend_source(name, tokens)

    def remove_source(self, name: str) -> None:
        self.index.remove_source(name)

    @property
    def source_names(self) -> list[str]:
        return self.index.source_names

    def reset(self) -> None:
        """Forget the context (the next `propose` may get an unrelated sequence)."""
        self.index.reset_context()
        self.last_candidate = None

    def release(self) -> None:
        """Nothing to free: the index dies with the proposer."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Proposal:
        limits, select = self._limits, self.config.select
        candidate = self.index.speculate(context, limits, max_tokens, select)
        if self.global_history is not None and max_tokens > 0:
            if self.mode == "tree" or candidate is None or not candidate.tokens:
                shared = self.global_history.speculate(context, limits, max_tokens, select)
                if shared is not None and shared.tokens and (candidate is None or shared.score > candidate.score):
                    candidate = shared
        self.last_candidate = candidate
        return Proposal(tokens=list(candidate.tokens) if candidate is not None else [])


class SuffixOptions(BaseModel):
    """SuffixDecoding knobs, validated (see `SuffixConfig`); SSR's draft-backed suffix stage uses them too."""

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


class SuffixDecodingConfig(MethodConfig):
    """Suffix decoding (the baseline vLLM calls `method: suffix`): SuffixDecoding over the
    request's prompt + output, and the shared history of past responses when "global" is among
    `sources`. Speculates both phases (thinking and answer) under the thinking rules.
    `with_prompt_lookup` proposes, each step, the longer of its candidate and prompt lookup's
    (`spec.longest`): the two copy-based peers combined, without SSR."""

    method: Literal["suffix"] = "suffix"
    suffix: SuffixOptions = Field(default_factory=SuffixOptions)
    sources: list[Literal["prompt", "output", "global"]] = Field(default_factory=lambda: ["prompt", "output"])
    with_prompt_lookup: bool = False

    def build(self, ctx: MethodContext) -> ThinkingPolicy:
        history = ctx.global_history if "global" in self.sources else None
        index_context = "prompt" in self.sources or "output" in self.sources
        proposer = SuffixProposer(self.suffix.to_config(index_context=index_context), global_history=history)
        if self.with_prompt_lookup:
            from selfspec.spec.longest import LongestProposer  # longest imports this module
            from selfspec.spec.ngram import NgramProposer

            proposer = LongestProposer([NgramProposer(), proposer])
        return ThinkingPolicy(
            ctx.thinking_format, ctx.limits, thinking=ctx.thinking, proposer=proposer, history=history
        )
