"""The arbitrator's RL: PPO-clip over full CoSpec rollouts.

Per iteration `rl_prompts` training items, M = `group_size` (default 12) rollouts each, in
one engine batch; the arbitrator's keep decisions are sampled, keep ~ Bernoulli(π), with a
per-rollout seed (`CoSpecConfig.sample_seed`), and the recorder stores every decision's
state, action, logit (the behaviour log-probability) and the target's log-probability of
the draft token. Reward of a rollout (`rollout_reward`):

    score (checker, partial credit in [0, 1])
    + speed_coef × accepted tokens per target verification (kept tokens count as accepted)
    − low_logprob_penalty × (kept draft tokens whose target log-prob < low_logprob_floor) / arbitrations
    − failed_rejection_penalty × (rejected arbitrations / arbitrations), on failed rollouts only

Advantages are centred within each prompt's group of M rollouts; every decision of a
rollout gets its rollout's advantage. `training.ppo_step` (clip 0.2, KL 0.02 to the frozen
SFT arbitrator, entropy 0.01) runs `ppo_epochs` passes over at most `rl_max_decisions`
decisions (seeded subsample) in minibatches of `ppo_minibatch`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from selfspec import CoSpecConfig, SamplingParams
from selfspec.spec.cospec.arbitrator import Arbitrator
from selfspec.spec.cospec.policy import Decision
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.eval_tasks import EvalItem, EvalTask, answer_text
from selfspec_research.cospec.rollouts import Request, is_cancelled, run_requests
from selfspec_research.cospec.training import (
    PPOSettings,
    RolloutBatch,
    action_logprob,
    group_centred_advantages,
    ppo_step,
)
from selfspec_research.thinker.tasks import stable_rng


class RewardSettings(BaseModel):
    """The weights of a rollout's reward (module doc; `TrainConfig` holds the run's)."""

    model_config = ConfigDict(extra="forbid")

    speed_coef: float = 0.05
    low_logprob_floor: float = -5.0
    low_logprob_penalty: float = 0.5
    failed_rejection_penalty: float = 0.1


def rollout_reward(
    score: float,
    passed: bool,
    accepted_tokens: int,
    verify_steps: int,
    decisions: Sequence[Decision],
    settings: RewardSettings,
) -> dict[str, float]:
    """The reward of one CoSpec rollout and its parts (module doc)."""
    arbitrations = len(decisions)
    kept = sum(d.kept for d in decisions)
    low = sum(
        d.kept and d.target_logprob is not None and d.target_logprob < settings.low_logprob_floor for d in decisions
    )
    tau = accepted_tokens / verify_steps if verify_steps else 0.0
    speed = settings.speed_coef * tau
    low_penalty = settings.low_logprob_penalty * low / arbitrations if arbitrations else 0.0
    rejection_penalty = (
        settings.failed_rejection_penalty * (arbitrations - kept) / arbitrations if arbitrations and not passed else 0.0
    )
    return {
        "reward": float(score) + speed - low_penalty - rejection_penalty,
        "score": float(score),
        "passed": float(bool(passed)),
        "accepted_per_call": tau,
        "arbitrations": float(arbitrations),
        "kept": float(kept),
        "low_logprob_kept": float(low),
        "speed_bonus": speed,
        "low_logprob_penalty": low_penalty,
        "rejection_penalty": rejection_penalty,
    }


def rl_iteration(
    llm,
    arbitrator: Arbitrator,
    reference: Arbitrator,
    optimizer: torch.optim.Optimizer,
    prompts: Sequence[tuple[EvalTask, EvalItem]],
    config: TrainConfig,
    iteration: int,
    *,
    deadline: float | None = None,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
) -> dict[str, Any] | None:
    """M sampled CoSpec rollouts per prompt, rewards, group-centred advantages, PPO epochs.

    Returns the iteration's stats, or None when the deadline cut the rollouts (no update).
    """
    m = config.group_size
    recorded: list[list[Decision]] = []
    requests: list[Request] = []
    for p, (task, item) in enumerate(prompts):
        for r in range(m):
            decisions: list[Decision] = []
            recorded.append(decisions)
            seed = stable_rng("cospec-rl", config.seed, iteration, p, r).getrandbits(62)
            spec = CoSpecConfig(
                num_speculative_tokens=config.k,
                max_prefix_tokens=config.max_prefix_tokens,
                prefix_window=config.prefix_window,
                arbitrator=arbitrator,
                recorder=decisions.append,
                sample_seed=seed,
            )
            requests.append(Request(item.messages, SamplingParams(max_tokens=config.max_tokens), spec, task.thinking))
    arbitrator.eval()
    seqs = run_requests(llm, requests, deadline)
    if any(is_cancelled(s) for s in seqs):
        return None
    results = [llm.result(s) for s in seqs]
    # Score per task, in one batch each.
    verdicts: list[tuple[bool, float]] = [(False, 0.0)] * len(results)
    by_task: dict[str, list[int]] = {}
    for index in range(len(results)):
        by_task.setdefault(prompts[index // m][0].name, []).append(index)
    for name, indices in by_task.items():
        task = prompts[indices[0] // m][0]
        texts = [answer_text(llm, results[i].token_ids, results[i].reasoning_text is not None) for i in indices]
        for i, verdict in zip(indices, task.score([prompts[i // m][1].reference for i in indices], texts)):
            verdicts[i] = (bool(verdict[0]), float(verdict[1]))
    settings = RewardSettings(
        speed_coef=config.speed_coef,
        low_logprob_floor=config.low_logprob_floor,
        low_logprob_penalty=config.low_logprob_penalty,
        failed_rejection_penalty=config.failed_rejection_penalty,
    )
    parts = [
        rollout_reward(
            verdicts[i][1],
            verdicts[i][0],
            out.metrics.get("accepted_tokens", 0),
            out.metrics.get("verify_steps", 0),
            recorded[i],
            settings,
        )
        for i, out in enumerate(results)
    ]
    rewards = torch.tensor([p["reward"] for p in parts], dtype=torch.float32)
    groups = torch.arange(len(prompts)).repeat_interleave(m)
    advantages = group_centred_advantages(rewards, groups)
    # Every sampled decision, with its rollout's reward and advantage.
    flat = [(i, d) for i, decisions in enumerate(recorded) for d in decisions if d.sampled and d.keep_logit is not None]
    if len(flat) > config.rl_max_decisions:
        rng = stable_rng("cospec-rl-decisions", config.seed, iteration)
        flat = [flat[j] for j in sorted(rng.sample(range(len(flat)), config.rl_max_decisions))]
    ppo = PPOSettings(clip=config.clip, kl_coef=config.kl_coef, entropy_coef=config.entropy_coef, group_size=m)
    updates: list[dict[str, float]] = []
    if flat:
        actions = torch.tensor([float(d.kept) for _, d in flat])
        old_logprobs = action_logprob(torch.tensor([d.keep_logit for _, d in flat]), actions)
        decision_rewards = rewards[torch.tensor([i for i, _ in flat])]
        decision_advantages = advantages[torch.tensor([i for i, _ in flat])]
        generator = torch.Generator().manual_seed(config.seed * 100_003 + iteration)
        for epoch in range(config.ppo_epochs):
            order = torch.randperm(len(flat), generator=generator)
            for start in range(0, len(flat), config.ppo_minibatch):
                rows = order[start : start + config.ppo_minibatch]
                batch = RolloutBatch(
                    states=[flat[j][1].state for j in rows.tolist()],
                    state_index=torch.arange(len(rows)),
                    actions=actions[rows],
                    old_logprobs=old_logprobs[rows],
                    rewards=decision_rewards[rows],
                    advantages=decision_advantages[rows],
                )
                stats = ppo_step(arbitrator, reference, optimizer, batch, ppo)
                updates.append(stats)
                log(
                    {
                        "phase": "rl",
                        "iteration": iteration,
                        "epoch": epoch,
                        "minibatch": start // config.ppo_minibatch,
                        **{k: round(v, 6) for k, v in stats.items()},
                    }
                )

    def mean(key: str) -> float:
        return round(sum(p[key] for p in parts) / len(parts), 4)

    summary = {
        "phase": "rl_iteration",
        "iteration": iteration,
        "prompts": [item.uid for _, item in prompts],
        "rollouts": len(results),
        "decisions": sum(len(d) for d in recorded),
        "decisions_used": len(flat),
        "updates": len(updates),
        "mean_reward": round(float(rewards.mean()), 4),
        "reward_std": round(float(rewards.std()), 4) if len(rewards) > 1 else 0.0,
        "mean_score": mean("score"),
        "pass_rate": mean("passed"),
        "mean_accepted_per_call": mean("accepted_per_call"),
        "kept_share": round(sum(p["kept"] for p in parts) / max(1.0, sum(p["arbitrations"] for p in parts)), 4),
        "low_logprob_kept": int(sum(p["low_logprob_kept"] for p in parts)),
        "mean_output_tokens": round(sum(len(r.token_ids) for r in results) / len(results), 1),
        "loss": round(sum(u["loss"] for u in updates) / len(updates), 6) if updates else None,
        "kl": round(updates[-1]["kl"], 6) if updates else None,
        "entropy": round(updates[-1]["entropy"], 6) if updates else None,
        "clip_fraction": round(sum(u["clip_fraction"] for u in updates) / len(updates), 4) if updates else None,
    }
    return summary


def rl_prompts_for(
    tasks: Sequence[EvalTask], config: TrainConfig, iteration: int, eligible: Callable[[EvalTask, EvalItem], bool]
) -> list[tuple[EvalTask, EvalItem]]:
    """The `rl_prompts` items of an iteration: a fixed seeded order, walked round-robin."""
    pool = [(t, item) for t in tasks for item in t.items if eligible(t, item)]
    if not pool:
        return []
    stable_rng("cospec-rl-order", config.seed).shuffle(pool)
    count = min(config.rl_prompts, len(pool))
    return [pool[(iteration * count + j) % len(pool)] for j in range(count)]


__all__ = ["RewardSettings", "rl_iteration", "rl_prompts_for", "rollout_reward"]
