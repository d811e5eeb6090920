"""Training the arbitrator: SFT on labelled mismatch states, then PPO-clip (toy scale on CPU).

The pipeline, as in the paper:
1. Mismatch states are collected from SpS rollouts (`collect_mismatch_states`: CoSpec in
   collection mode, which is exact SpS that records every first mismatch of a round).
2. Each state is labelled by counterfactual continuations: continue once from the prefix
   plus the draft token and once from the prefix plus the target token, and compare.
   The paper judges the continuations by task outcome (a checker). Here the stand-in is the
   target's own likelihood (`counterfactual_gains`): the summed target log-probability of the
   decided token plus an H-token greedy target continuation; the gain is draft branch minus
   target branch, and the label is gain >= -margin ("keeping the draft token costs the
   target at most `margin` nats over the horizon"). A task checker plugs in at the same place.
3. SFT: binary cross-entropy on (state, label) (`sft_step`).
4. RL: PPO-clip (clip 0.2) with group-centred advantages over M rollouts per group, a KL
   penalty (0.02) to the frozen SFT policy and an entropy bonus (0.01) (`ppo_step`).
   The toy's episodes are one decision long: a group is M sampled decisions at the same
   mismatch state, rewarded by `toy_reward` (the counterfactual gain plus a speed bonus
   for a kept token, 0 for a rejected one). Full-sequence rollouts with task rewards
   reuse `ppo_step` unchanged; only the reward and the grouping change.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from selfspec import CoSpecConfig, SamplingParams
from selfspec.spec.cospec.arbitrator import ArbitrationState, Arbitrator, build_batch
from selfspec.spec.cospec.policy import Decision

# ------------------------------------------------------------------ data


def collect_mismatch_states(
    llm, prompts: Sequence, *, num_speculative_tokens: int = 5, max_tokens: int = 64, max_prefix_tokens: int = 512
) -> list[ArbitrationState]:
    """Mismatch states of greedy SpS rollouts over `prompts` (outputs are exact SpS)."""
    decisions: list[Decision] = []
    spec = CoSpecConfig(
        num_speculative_tokens=num_speculative_tokens,
        threshold=2.0,  # > 1: nothing is kept, so the rollouts are exactly SpS
        max_prefix_tokens=max_prefix_tokens,
        recorder=decisions.append,
    )
    llm.generate(list(prompts), SamplingParams(max_tokens=max_tokens), spec=spec)
    return [d.state for d in decisions]


@torch.inference_mode()
def counterfactual_gains(target: torch.nn.Module, states: Sequence[ArbitrationState], horizon: int = 4) -> torch.Tensor:
    """[N] target log-likelihood of (draft token + greedy continuation) minus (target token + ...).

    Both branches share the prefix and have the same length, so they run as a batch of two.
    """
    device = next(target.parameters()).device
    gains = torch.empty(len(states))
    for i, state in enumerate(states):
        prefix = list(state.prefix)
        ids = torch.tensor([prefix + [state.draft_block[0]], prefix + [state.target_block[0]]], device=device)
        for _ in range(horizon):
            next_ids = target(input_ids=ids).logits[:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, next_ids], dim=1)
        logprobs = torch.log_softmax(target(input_ids=ids).logits[:, len(prefix) - 1 : -1].float(), dim=-1)
        scores = logprobs.gather(-1, ids[:, len(prefix) :].unsqueeze(-1)).squeeze(-1).sum(dim=-1)
        gains[i] = scores[0] - scores[1]
    return gains


def labels_from_gains(gains: torch.Tensor, margin: float) -> torch.Tensor:
    """1.0 where keeping the draft token costs at most `margin` nats, else 0.0."""
    return (gains >= -margin).float()


# ------------------------------------------------------------------ SFT


def bce_loss(arbitrator: Arbitrator, states: Sequence[ArbitrationState], labels: torch.Tensor) -> torch.Tensor:
    device = arbitrator.head.weight.device
    logits = arbitrator(build_batch(states, device))
    return F.binary_cross_entropy_with_logits(logits, labels.to(device).float())


def sft_step(
    arbitrator: Arbitrator, optimizer: torch.optim.Optimizer, states: Sequence[ArbitrationState], labels: torch.Tensor
) -> float:
    """One BCE step (adapter dropout active); returns the loss before the update."""
    arbitrator.train()
    optimizer.zero_grad(set_to_none=True)
    loss = bce_loss(arbitrator, states, labels)
    loss.backward()
    optimizer.step()
    arbitrator.eval()
    return float(loss.detach())


# ------------------------------------------------------------------ RL


class PPOSettings(BaseModel):
    """The paper's RL hyper-parameters."""

    model_config = ConfigDict(extra="forbid")

    clip: float = Field(0.2, gt=0.0)
    kl_coef: float = Field(0.02, ge=0.0)
    entropy_coef: float = Field(0.01, ge=0.0)
    group_size: int = Field(4, ge=2)  # M rollouts per group


@dataclass
class RolloutBatch:
    """Sampled decisions: one row per rollout; `state_index` says which state it acted in."""

    states: list[ArbitrationState]  # unique states
    state_index: torch.Tensor  # [R] long
    actions: torch.Tensor  # [R] float, 1 = keep draft
    old_logprobs: torch.Tensor  # [R]
    rewards: torch.Tensor  # [R]
    advantages: torch.Tensor  # [R]


def frozen_copy(arbitrator: Arbitrator) -> Arbitrator:
    """The reference policy for the KL term (the SFT arbitrator, frozen)."""
    reference = copy.deepcopy(arbitrator)
    reference.requires_grad_(False)
    reference.eval()
    return reference


def action_logprob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log π(a) of a Bernoulli(sigmoid(logits)) decision."""
    return actions * F.logsigmoid(logits) + (1.0 - actions) * F.logsigmoid(-logits)


def bernoulli_kl(logits: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
    """KL(π || π_ref) per decision, exact for two outcomes."""
    p = torch.sigmoid(logits)
    return p * (F.logsigmoid(logits) - F.logsigmoid(reference_logits)) + (1 - p) * (
        F.logsigmoid(-logits) - F.logsigmoid(-reference_logits)
    )


def bernoulli_entropy(logits: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(logits)
    return -(p * F.logsigmoid(logits) + (1 - p) * F.logsigmoid(-logits))


def group_centred_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """r - mean(r over its group): the group baseline replaces a value function."""
    num_groups = int(groups.max()) + 1
    sums = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, groups, rewards)
    counts = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, groups, torch.ones_like(rewards))
    return rewards - (sums / counts)[groups]


def toy_reward(gains: torch.Tensor, speed_bonus: float = 0.5) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Keep: counterfactual gain + a bonus for the target forward a kept token saves; reject: 0."""

    def reward(state_index: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return actions * (gains[state_index] + speed_bonus)

    return reward


def sample_rollouts(
    arbitrator: Arbitrator,
    states: Sequence[ArbitrationState],
    reward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    group_size: int,
    generator: torch.Generator,
) -> RolloutBatch:
    """M decisions per state from the current policy (no adapter dropout), with advantages."""
    with torch.no_grad():
        logits = arbitrator(build_batch(states, arbitrator.head.weight.device)).cpu()
    state_index = torch.arange(len(states)).repeat_interleave(group_size)
    probs = torch.sigmoid(logits)[state_index]
    actions = torch.bernoulli(probs, generator=generator)
    rewards = reward(state_index, actions).float()
    return RolloutBatch(
        states=list(states),
        state_index=state_index,
        actions=actions,
        old_logprobs=action_logprob(logits[state_index], actions),
        rewards=rewards,
        advantages=group_centred_advantages(rewards, state_index),
    )


def ppo_step(
    arbitrator: Arbitrator,
    reference: Arbitrator,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    settings: PPOSettings | None = None,
) -> dict[str, float]:
    """One PPO-clip update: -min(ρA, clip(ρ)A) + β·KL(π||π_ref) - c·H(π), averaged over rollouts."""
    settings = settings or PPOSettings()
    device = arbitrator.head.weight.device
    inputs = build_batch(batch.states, device)
    with torch.no_grad():
        reference_logits = reference(inputs).cpu()[batch.state_index]
    arbitrator.train()
    optimizer.zero_grad(set_to_none=True)
    logits = arbitrator(inputs).cpu()[batch.state_index]
    logprobs = action_logprob(logits, batch.actions)
    ratio = torch.exp(logprobs - batch.old_logprobs)
    clipped = ratio.clamp(1.0 - settings.clip, 1.0 + settings.clip)
    surrogate = torch.minimum(ratio * batch.advantages, clipped * batch.advantages).mean()
    kl = bernoulli_kl(logits, reference_logits).mean()
    entropy = bernoulli_entropy(logits).mean()
    loss = -surrogate + settings.kl_coef * kl - settings.entropy_coef * entropy
    loss.backward()
    optimizer.step()
    arbitrator.eval()
    return {
        "loss": float(loss.detach()),
        "surrogate": float(surrogate.detach()),
        "kl": float(kl.detach()),
        "entropy": float(entropy.detach()),
        "clip_fraction": float(((ratio - 1.0).abs() > settings.clip).float().mean()),
        "mean_reward": float(batch.rewards.mean()),
    }
