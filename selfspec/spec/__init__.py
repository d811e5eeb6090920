"""Speculation: proposers guess continuations, verifiers keep what the target agrees with.

Proposers: `SuffixProposer` (SuffixDecoding counts tree, or unbounded longest match
over contiguous sources such as SSR drafts), `NgramProposer` (prompt lookup).
Verifiers: `GreedyVerifier` (exact match) and `RejectionVerifier` (lossless rejection
sampling with or without draft probabilities), plus the functions they wrap.
"""

from selfspec.spec.ngram import NgramProposer
from selfspec.spec.base import ContextCursor, Proposal, Proposer
from selfspec.spec.suffix_index import (
    CONTEXT_SOURCE,
    Candidate,
    CountsTree,
    LongestMatchSource,
    SpeculationLimits,
    SuffixAutomaton,
    SuffixIndex,
)
from selfspec.spec.suffix import GLOBAL_SOURCE, GlobalSuffixHistory, SuffixConfig, SuffixProposer
from selfspec.engine.verify import (
    GreedyVerifier,
    RejectionVerifier,
    Verifier,
    VerifyResult,
    verifier_for,
    verify_greedy,
    verify_rejection_deterministic,
    verify_rejection_with_draft_probs,
)

__all__ = [
    "CONTEXT_SOURCE",
    "GLOBAL_SOURCE",
    "Candidate",
    "ContextCursor",
    "CountsTree",
    "GlobalSuffixHistory",
    "GreedyVerifier",
    "LongestMatchSource",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "RejectionVerifier",
    "SpeculationLimits",
    "SuffixAutomaton",
    "SuffixConfig",
    "SuffixIndex",
    "SuffixProposer",
    "Verifier",
    "VerifyResult",
    "verifier_for",
    "verify_greedy",
    "verify_rejection_deterministic",
    "verify_rejection_with_draft_probs",
]
