"""The options of an arbitrator training run (`TrainConfig`) and their defaults.

Kept light (pydantic and the task names only) so the CLI builds its options from it
without loading the engine. What the options mean is told in `train_arbitrator`'s
module doc.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from selfspec_research.cospec.eval_config import DEFAULT_DRAFT, DEFAULT_K
from selfspec_research.cospec.eval_tasks import GSM8K, known_tasks
from selfspec_research.thinker.data_versions import HELDOUT_SEED, TRAIN_SEED

DEFAULT_TARGET = "smollm2-thinker"
DEFAULT_TASKS: tuple[str, ...] = ("class_synthesis", "record_extraction", "route_finding", "arithmetic_search", GSM8K)
THINKER_ITEM_START = 2000
"""The smollm2-thinker adapter trained on items 0..1999 per family of stream 0 (its TRAINING.md)."""
HELDOUT_SEED_FLOOR = HELDOUT_SEED
"""The eval's held-out thinker streams start here; never train on them."""


class TrainConfig(BaseModel):
    """Every option of a training run (recorded in `config.json` and the checkpoint)."""

    model_config = ConfigDict(extra="forbid")

    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    tasks: tuple[str, ...] = DEFAULT_TASKS
    n: int = Field(8, ge=1)  # training items per task
    data_seed: int = Field(TRAIN_SEED, ge=0)  # thinker training stream
    item_start: int = Field(THINKER_ITEM_START, ge=0)
    gsm8k_path: str | None = None
    # rollouts
    k: int = Field(DEFAULT_K, ge=1, le=64)  # draft tokens per round
    max_tokens: int = Field(1024, ge=1)
    max_prefix_tokens: int = Field(512, ge=1)
    prefix_window: Literal["anchored", "sliding"] = "anchored"  # CoSpecConfig.prefix_window
    # states and labels
    states_per_item: int = Field(8, ge=1)
    max_states: int = Field(256, ge=1)
    cf_max_new_tokens: int = Field(1024, ge=1)
    tie_label: Literal["likelihood", "keep"] = "likelihood"
    gain_horizon: int = Field(8, ge=0)
    gain_margin: float = Field(3.0, ge=0.0)
    # SFT
    sft_epochs: int = Field(3, ge=0)
    sft_lr: float = Field(2e-4, gt=0.0)
    sft_batch_size: int = Field(16, ge=1)
    # RL
    rl_iterations: int = Field(8, ge=0)
    rl_prompts: int = Field(2, ge=1)  # prompts per iteration
    group_size: int = Field(12, ge=2)  # M rollouts per prompt
    rl_lr: float = Field(5e-5, gt=0.0)
    ppo_epochs: int = Field(2, ge=1)
    ppo_minibatch: int = Field(32, ge=1)
    rl_max_decisions: int = Field(512, ge=1)
    clip: float = Field(0.2, gt=0.0)
    kl_coef: float = Field(0.02, ge=0.0)
    entropy_coef: float = Field(0.01, ge=0.0)
    speed_coef: float = Field(0.05, ge=0.0)
    low_logprob_floor: float = -5.0
    low_logprob_penalty: float = Field(0.5, ge=0.0)
    failed_rejection_penalty: float = Field(0.1, ge=0.0)
    # run
    time_budget_s: float | None = Field(None, gt=0.0)
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    num_slots: int = Field(32, ge=1)
    max_len: int | None = Field(None, ge=16)
    out: str = "runs/cospec-arbitrator"
    resume: bool = False
    progress: bool = True
    command: str | None = None

    @field_validator("tasks", mode="before")
    @classmethod
    def _parse_tasks(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        names = tuple(dict.fromkeys(value))
        unknown = [name for name in names if name not in known_tasks()]
        if not names or unknown:
            raise ValueError(f"unknown tasks {unknown or list(names)}; known: {', '.join(known_tasks())}")
        return names

    @field_validator("data_seed")
    @classmethod
    def _training_stream(cls, value: int) -> int:
        if value >= HELDOUT_SEED_FLOOR:
            raise ValueError(f"data_seed {value} is a held-out eval stream (>= {HELDOUT_SEED_FLOOR}); train on another")
        return value

    def data_key(self) -> dict[str, Any]:
        """The options that decide the labelled data (a resumed run must keep them)."""
        keys = (
            "target",
            "draft",
            "tasks",
            "n",
            "data_seed",
            "item_start",
            "k",
            "max_tokens",
            "max_prefix_tokens",
            "prefix_window",
        )
        return {key: (list(v) if isinstance(v := getattr(self, key), tuple) else v) for key in keys}


__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "DEFAULT_TASKS",
    "HELDOUT_SEED_FLOOR",
    "THINKER_ITEM_START",
    "TrainConfig",
]
