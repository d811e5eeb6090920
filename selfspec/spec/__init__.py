"""Speculation methods, one module each, behind the contract of `selfspec.engine.policy`.

- `base`: `MethodConfig` (every method's config base), `MethodContext`, the `Proposer` shape.
- `suffix_index`, `suffix`: SuffixDecoding's counts tree / longest-match index, and the
  `SuffixDecodingConfig` method.
- `ngram`: prompt lookup (`PromptLookupConfig`).
- `draft_model`, `distilled_draft`: draft-model speculation (`DraftModelConfig`) and the
  loading of a distilled shallow self-draft.
- `ssr`: self-speculation for reasoning models (`SSRConfig`, `SSRPolicy`).
- `cospec/`: CoSpec inference (`CoSpecConfig`, the arbitrator) — lossy by design.

Verification of every lossless method lives in one place: `selfspec.engine.verify`.
"""

from selfspec.engine.policy import Proposal
from selfspec.spec.base import ContextCursor, MethodConfig, MethodContext, Proposer
from selfspec.spec.ngram import NgramProposer
from selfspec.spec.suffix import GLOBAL_SOURCE, GlobalSuffixHistory, SuffixConfig, SuffixProposer
from selfspec.spec.suffix_index import (
    CONTEXT_SOURCE,
    Candidate,
    CountsTree,
    LongestMatchSource,
    SpeculationLimits,
    SuffixAutomaton,
    SuffixIndex,
)

__all__ = [
    "CONTEXT_SOURCE",
    "GLOBAL_SOURCE",
    "Candidate",
    "ContextCursor",
    "CountsTree",
    "GlobalSuffixHistory",
    "LongestMatchSource",
    "MethodConfig",
    "MethodContext",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "SpeculationLimits",
    "SuffixAutomaton",
    "SuffixConfig",
    "SuffixIndex",
    "SuffixProposer",
]
