"""The arbitrator's SFT: binary cross-entropy on the labelled states, through the shared loop.

Shuffled minibatches of `sft_batch_size` states over `sft_epochs` epochs (a seeded
permutation per epoch), AdamW at a constant `sft_lr` (`lora_training.run_steps` with no
warm-up and a floor of 1), adapter dropout active while training. A deadline ends the
run between steps; the arbitrator is left in eval mode (no dropout), as inference uses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from selfspec.spec.cospec.arbitrator import Arbitrator
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.arbitrator_states import LabelledState
from selfspec_research.cospec.training import bce_loss
from selfspec_research.lora_training import OptimizerSettings, StepReport, run_steps

ADAMW_WEIGHT_DECAY = 0.01
"""torch's AdamW default, which the arbitrator's SFT (and RL) optimizers use."""


def mean_bce(arbitrator: Arbitrator, examples: Sequence[LabelledState], batch_size: int = 32) -> float:
    """BCE over `examples` in the arbitrator's current mode (eval: no dropout), no gradient."""
    if not examples:
        return float("nan")
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            labels = torch.tensor([x.label for x in chunk])
            total += float(bce_loss(arbitrator, [x.state for x in chunk], labels)) * len(chunk)
    return total / len(examples)


def sft_plan(num_examples: int, config: TrainConfig) -> list[tuple[int, list[int]]]:
    """(epoch, example indices) of every SFT step: a seeded permutation per epoch, cut into
    minibatches of `sft_batch_size`."""
    plan: list[tuple[int, list[int]]] = []
    for epoch in range(config.sft_epochs if num_examples else 0):
        generator = torch.Generator().manual_seed(config.seed * 1000 + epoch)
        order = torch.randperm(num_examples, generator=generator).tolist()
        plan += [
            (epoch, order[start : start + config.sft_batch_size])
            for start in range(0, num_examples, config.sft_batch_size)
        ]
    return plan


def run_sft(
    arbitrator: Arbitrator,
    examples: Sequence[LabelledState],
    config: TrainConfig,
    *,
    deadline: float | None = None,
    log: Callable[[dict[str, Any]], None] = lambda record: None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train `arbitrator` on `examples` (module doc); the BCE before and after, the steps run."""
    before = mean_bce(arbitrator, examples)

    def step(payload: tuple[int, list[int]]) -> dict[str, float]:
        chunk = [examples[i] for i in payload[1]]
        loss = bce_loss(arbitrator, [x.state for x in chunk], torch.tensor([x.label for x in chunk]))
        loss.backward()
        return {"loss": float(loss.detach())}

    def record(report: StepReport) -> None:
        epoch, indices = report.payload
        log(
            {
                "phase": "sft",
                "step": report.step,
                "epoch": epoch,
                "loss": round(report.stats["loss"], 6),
                "batch": len(indices),
            }
        )

    run = run_steps(
        arbitrator,
        list(arbitrator.trainable_parameters()),
        sft_plan(len(examples), config),
        step,
        OptimizerSettings(lr=config.sft_lr, weight_decay=ADAMW_WEIGHT_DECAY),
        should_stop=lambda steps_done: deadline is not None and time.monotonic() >= deadline,
        on_step=record,
        postfix=lambda report: {"loss": f"{report.stats['loss']:.4f}"},
        progress=progress,
        desc="SFT",
    )
    arbitrator.eval()
    after = mean_bce(arbitrator, examples)
    return {"steps": run.steps, "bce_before": before, "bce_after": after, "stopped_by_time_budget": run.stopped_early}


__all__ = ["ADAMW_WEIGHT_DECAY", "mean_bce", "run_sft", "sft_plan"]
