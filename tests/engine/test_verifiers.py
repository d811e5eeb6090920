"""Verifiers: greedy exact match, and rejection sampling that preserves the target distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from selfspec.engine.policy import Proposal
from selfspec.engine.verify import (
    VerifyResult,
    verify_greedy,
    verify_proposal,
    verify_rejection_deterministic,
    verify_rejection_with_draft_probs,
)

VOCAB = 6
TRIALS = 20_000


def random_distributions(rows: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.tensor(rng.dirichlet(np.ones(VOCAB), size=rows), dtype=torch.float32)


def emitted_tokens(result: VerifyResult, proposal: list[int]) -> list[int]:
    """The tokens a verification commits: the accepted prefix, then the next token."""
    return proposal[: result.num_accepted] + [result.next_token]


def chi_square_p_value(samples: list[int], expected_probs: torch.Tensor) -> float:
    observed = np.bincount(samples, minlength=VOCAB)
    expected = expected_probs.double().numpy() * len(samples)
    return float(chisquare(observed, expected / expected.sum() * observed.sum()).pvalue)


# ----------------------------------------------------------------------------- greedy


@pytest.mark.parametrize(
    ("proposal", "expected"),
    [
        ([3, 1, 4], VerifyResult(3, 7)),  # all accepted: the bonus token follows
        ([0, 1, 4], VerifyResult(0, 3)),  # none accepted: the target's own token
        ([3, 1, 5], VerifyResult(2, 4)),  # partial: correction at the first mismatch
        ([3, 2, 4], VerifyResult(1, 1)),  # a later match after a mismatch does not count
        ([], VerifyResult(0, 3)),  # empty proposal: a plain decode step
    ],
)
def test_verify_greedy(proposal: list[int], expected: VerifyResult) -> None:
    target_argmax = torch.tensor([3, 1, 4, 7])[: len(proposal) + 1]
    assert verify_greedy(target_argmax, proposal) == expected


def test_greedy_verification_takes_an_argmax_tensor_or_list() -> None:
    logits = torch.full((4, VOCAB), -1.0)
    logits[torch.arange(4), torch.tensor([2, 5, 0, 1])] = 3.0
    argmax = logits.argmax(-1)
    assert verify_proposal(Proposal([2, 5, 3]), argmax=argmax, probs=None, generator=None) == VerifyResult(2, 0)
    assert verify_proposal(Proposal([2, 5, 0]), argmax=argmax.tolist(), probs=None, generator=None) == VerifyResult(
        3, 1
    )
    with pytest.raises(ValueError):
        verify_proposal(Proposal([2]), argmax=None, probs=None, generator=None)
    with pytest.raises(ValueError):
        verify_greedy(torch.tensor([1, 2]), [1, 2])


# ------------------------------------------------------------------ rejection sampling


def run_trials(verify, proposals: list[list[int]], seed: int) -> tuple[list[int], list[int]]:
    """Committed token at position 0 for every trial, and at position 1 when position 0
    was an accepted proposal token (so position 1 was decided by the verifier too)."""
    generator = torch.Generator().manual_seed(seed)
    first, second = [], []
    for proposal in proposals:
        tokens = emitted_tokens(verify(proposal, generator), proposal)
        first.append(tokens[0])
        if len(tokens) > 1:
            second.append(tokens[1])
    return first, second


def sample_proposals(q: torch.Tensor, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    columns = [rng.choice(VOCAB, size=TRIALS, p=(row / row.sum()).double().numpy()) for row in q]
    return [list(map(int, tokens)) for tokens in zip(*columns)]


def test_rejection_with_draft_probs_preserves_the_target_distribution() -> None:
    p, q = random_distributions(3, seed=1), random_distributions(2, seed=2)
    proposals = sample_proposals(q, seed=3)
    first, second = run_trials(lambda x, g: verify_rejection_with_draft_probs(p, x, q, g), proposals, seed=4)
    assert chi_square_p_value(first, p[0]) > 0.01
    assert len(second) > 5_000
    assert chi_square_p_value(second, p[1]) > 0.01
    # The test has power: the raw draft tokens (distributed as q) are rejected.
    assert chi_square_p_value([x[0] for x in proposals], p[0]) < 0.01


@pytest.mark.parametrize("fixed", [True, False])
def test_rejection_deterministic_preserves_the_target_distribution(fixed: bool) -> None:
    p = random_distributions(3, seed=5)
    if fixed:  # what a suffix or n-gram proposer does: the same guess every time
        proposals = [[int(p[0].argmax()), int(p[1].argmin())]] * TRIALS
    else:  # any proposal chosen independently of the verifier's randomness
        proposals = sample_proposals(random_distributions(2, seed=6), seed=7)
    first, second = run_trials(lambda x, g: verify_rejection_deterministic(p, x, g), proposals, seed=8)
    assert chi_square_p_value(first, p[0]) > 0.01
    assert len(second) > 2_000
    assert chi_square_p_value(second, p[1]) > 0.01


def test_deterministic_rejection_never_re_emits_the_rejected_token() -> None:
    p = random_distributions(2, seed=9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(2_000):
        result = verify_rejection_deterministic(p, [2], generator)
        if result.num_accepted == 0:
            assert result.next_token != 2


def test_acceptance_edge_cases() -> None:
    generator = torch.Generator().manual_seed(0)
    p = torch.zeros(2, VOCAB)
    p[0, 1] = 1.0
    p[1] = 1.0 / VOCAB
    for _ in range(50):
        assert verify_rejection_deterministic(p, [1], generator).num_accepted == 1  # p(x) = 1
        assert verify_rejection_deterministic(p, [0], generator) == VerifyResult(0, 1)  # p(x) = 0
        assert verify_rejection_with_draft_probs(p, [1], p[:1], generator).num_accepted == 1  # q == p
        assert verify_rejection_with_draft_probs(p, [3], p[1:], generator) == VerifyResult(0, 1)
    bonus = verify_rejection_deterministic(p, [], generator)
    assert bonus == VerifyResult(0, 1)


def test_seeded_generators_reproduce_and_global_rng_is_unused() -> None:
    p, q = random_distributions(5, seed=10), random_distributions(4, seed=11)
    proposal = [0, 1, 2, 3]

    def run(seed: int, global_seed: int) -> list[VerifyResult]:
        torch.manual_seed(global_seed)
        generator = torch.Generator().manual_seed(seed)
        return [verify_rejection_with_draft_probs(p, proposal, q, generator) for _ in range(20)] + [
            verify_rejection_deterministic(p, proposal, generator) for _ in range(20)
        ]

    assert run(seed=1, global_seed=1) == run(seed=1, global_seed=2)
    assert run(seed=1, global_seed=1) != run(seed=2, global_seed=1)


def test_rejection_verification_dispatches_on_draft_probs() -> None:
    p, q = random_distributions(3, seed=12), random_distributions(2, seed=13)

    def verify(proposal, generator):
        return verify_proposal(proposal, argmax=None, probs=p, generator=generator)

    with_q = verify(Proposal([1, 2], draft_probs=q), torch.Generator().manual_seed(3))
    assert with_q == verify_rejection_with_draft_probs(p, [1, 2], q, torch.Generator().manual_seed(3))
    one_hot = verify(Proposal([1, 2]), torch.Generator().manual_seed(3))
    assert one_hot == verify_rejection_deterministic(p, [1, 2], torch.Generator().manual_seed(3))
    with pytest.raises(ValueError):
        verify(Proposal([1, 2]), None)
    with pytest.raises(ValueError):
        verify_rejection_deterministic(p[:2], [1, 2], torch.Generator())
