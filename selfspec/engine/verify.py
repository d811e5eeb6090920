"""Verification: how much of a proposal the target model agrees with, and what it says next.

Every verifier sees the target's distributions at the k+1 positions of a k-token
proposal (before each proposal token, plus the bonus position after the last) and
returns the accepted prefix length and one more token: the correction at the first
rejection, or the bonus token when everything was accepted. So each target forward
commits between 1 and k+1 tokens.

Exactness is the contract:
* greedy: the committed tokens are exactly what plain greedy decoding produces;
* sampling: each committed token is distributed as the target's processed
  distribution (Leviathan et al. 2023, "Fast Inference from Transformers via
  Speculative Decoding"). A deterministic proposal is a draft whose q is one-hot,
  so acceptance is p(x) and a rejection resamples from p without x (as vLLM does
  for n-gram proposals).

All randomness comes from the caller's `torch.Generator`, so per-request seeds
reproduce. Each verification synchronises with the device twice at most: once for
the accepted count and once for the emitted token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from selfspec.engine.policy import Proposal


@dataclass
class VerifyResult:
    num_accepted: int  # number of proposal tokens accepted (a prefix)
    next_token: int  # the token emitted after the accepted prefix (correction or bonus)


def verify_greedy(target_argmax: torch.Tensor | Sequence[int], proposal: Sequence[int]) -> VerifyResult:
    """Longest prefix where the proposal equals the target argmax, then the argmax after it.

    `target_argmax` is [k+1]: the argmax at the position before each proposal token,
    plus the bonus position. One `.tolist()` is the only host sync.
    """
    targets = target_argmax.tolist() if isinstance(target_argmax, torch.Tensor) else list(target_argmax)
    k = len(proposal)
    if len(targets) < k + 1:
        raise ValueError(f"need {k + 1} target positions for a {k}-token proposal, got {len(targets)}")
    accepted = 0
    while accepted < k and proposal[accepted] == targets[accepted]:
        accepted += 1
    return VerifyResult(num_accepted=accepted, next_token=int(targets[accepted]))


def verify_rejection_with_draft_probs(
    target_probs: torch.Tensor,
    proposal: Sequence[int],
    draft_probs: torch.Tensor,
    generator: torch.Generator,
) -> VerifyResult:
    """Leviathan et al.: accept token i with probability min(1, p_i(x_i) / q_i(x_i)).

    At the first rejection the emitted token is drawn from norm(max(p_i - q_i, 0));
    when all k are accepted it is drawn from the bonus row `target_probs[k]`.
    `target_probs` is [k+1, V] (already temperature/top-k/top-p processed), `draft_probs`
    [k, V] the distributions the proposal tokens were sampled from.
    """
    k = len(proposal)
    _check_rows(target_probs, k)
    if draft_probs.shape[0] < k or draft_probs.shape[-1] != target_probs.shape[-1]:
        raise ValueError(f"draft_probs must be [{k}, {target_probs.shape[-1]}], got {tuple(draft_probs.shape)}")
    if k == 0:
        return VerifyResult(num_accepted=0, next_token=_sample(target_probs[0], generator))
    rows, tokens = _proposal_index(proposal, target_probs.device)
    p = target_probs[rows, tokens].float()
    q = draft_probs[rows, tokens].float()
    uniform = torch.rand(k, generator=generator, device=target_probs.device)
    # u < p/q, written without the division: q == 0 (never sampled) accepts iff p > 0.
    accepted = _accepted_prefix(uniform * q < p)
    if accepted == k:
        return VerifyResult(num_accepted=k, next_token=_sample(target_probs[k], generator))
    residual = (target_probs[accepted].float() - draft_probs[accepted].float()).clamp_min(0.0)
    return VerifyResult(
        num_accepted=accepted, next_token=_sample_or_fallback(residual, target_probs[accepted], generator)
    )


def verify_rejection_deterministic(
    target_probs: torch.Tensor,
    proposal: Sequence[int],
    generator: torch.Generator,
) -> VerifyResult:
    """Rejection sampling for a deterministic (one-hot) proposal, e.g. suffix or n-gram.

    Accept token x_i with probability p_i(x_i); at the first rejection draw from p_i
    with x_i removed (renormalised); if all are accepted draw the bonus from p_k.
    """
    k = len(proposal)
    _check_rows(target_probs, k)
    if k == 0:
        return VerifyResult(num_accepted=0, next_token=_sample(target_probs[0], generator))
    rows, tokens = _proposal_index(proposal, target_probs.device)
    p = target_probs[rows, tokens].float()
    uniform = torch.rand(k, generator=generator, device=target_probs.device)
    accepted = _accepted_prefix(uniform < p)
    if accepted == k:
        return VerifyResult(num_accepted=k, next_token=_sample(target_probs[k], generator))
    residual = target_probs[accepted].float().clone()
    residual[proposal[accepted]] = 0.0
    return VerifyResult(
        num_accepted=accepted, next_token=_sample_or_fallback(residual, target_probs[accepted], generator)
    )


# ------------------------------------------------------------------- the one entry


def verify_proposal(
    proposal: Proposal,
    *,
    argmax: Sequence[int] | torch.Tensor | None,
    probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> VerifyResult:
    """Verify a proposal the way its request decodes; the engine's only verification call.

    Greedy (`probs` None): exact match against the target's argmax at the k+1 positions.
    Sampling: rejection sampling with the draft's own distributions when the proposal carries
    them (a draft model), else as a one-hot draft (suffix, n-gram, SSR drafts without probs).
    """
    if probs is None:
        if argmax is None:
            raise ValueError("greedy verification needs the target's argmax")
        return verify_greedy(argmax, proposal.tokens)
    if generator is None:
        raise ValueError("rejection sampling needs the request's torch.Generator")
    if proposal.draft_probs is not None:
        return verify_rejection_with_draft_probs(probs, proposal.tokens, proposal.draft_probs, generator)
    return verify_rejection_deterministic(probs, proposal.tokens, generator)


# ------------------------------------------------------------------------- helpers


def _check_rows(target_probs: torch.Tensor, k: int) -> None:
    if target_probs.dim() != 2 or target_probs.shape[0] < k + 1:
        raise ValueError(f"target_probs must be [{k + 1}, V] for a {k}-token proposal, got {tuple(target_probs.shape)}")


def _proposal_index(proposal: Sequence[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.as_tensor(list(proposal), dtype=torch.long, device=device)
    return torch.arange(len(proposal), device=device), tokens


def _accepted_prefix(accept: torch.Tensor) -> int:
    """Length of the leading run of True (one host sync)."""
    return int(accept.to(torch.int32).cumprod(0).sum())


def _sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs.float(), 1, generator=generator))


def _sample_or_fallback(residual: torch.Tensor, fallback: torch.Tensor, generator: torch.Generator) -> int:
    """Sample the residual; if it is all zero (p == q up to rounding), sample p instead.

    The choice happens on the device, so it costs no extra synchronisation.
    """
    usable = torch.where(residual.sum() > 0, residual, fallback.float())
    return _sample(usable, generator)
