"""LoRA training of a small "thinker" on the seeded think→answer traces.

No reasoning model is reachable offline, so the testbed makes one: a base model (by
default SmolLM2-135M-Instruct) learns, through a LoRA adapter on every linear layer,
to write a chain of thought inside `<think>` … `</think>` and then an answer that the
CoT has already built piece by piece. That is the property SSR needs to be measured
honestly: a draft forked mid-thought should already hold part of the final answer.

The data and its tokenization are `thinker.examples`' (the engine's own token
boundaries); the loop is the shared one of `selfspec_research.lora_training` (AdamW,
warm-up + cosine, a step count fitted to the time budget). What is the thinker's own:
the loss (next-token cross-entropy on the assistant part only, from hidden states at
target positions), the held-out loss before and after, and the adapter's directory,
which the model registry finds by name and merges into the base at load.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from selfspec.models.loader import load_model, parse_dtype, resolve_device
from selfspec.models.registry import ADAPTER_MANIFEST
from selfspec.run_info import device_name, library_versions
from selfspec.thinking.format import ThinkingFormat
from selfspec_research.lora_training import (
    BUDGET_SHARE_FOR_STEPS,
    HARD_STOP_FACTOR,
    LoraSpec,
    OptimizerSettings,
    StepReport,
    TimeBudget,
    add_lora,
    autocast_factory,
    fit_steps,
    run_steps,
    save_lora_weights,
    selected_logits,
    step_seconds,
)
from selfspec_research.thinker.examples import (
    IGNORE_INDEX,
    DataSpec,
    Example,
    collate,
    early_answer_examples,
    encode_examples,
    plan_batches,
)

# --------------------------------------------------------------------------- loss


def target_loss(model: Any, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over target positions, and their count (the
    vocabulary projection runs on target rows only, in float32)."""
    picked = labels != IGNORE_INDEX
    logits = selected_logits(model, input_ids, picked)
    targets = labels[picked]
    return torch.nn.functional.cross_entropy(logits, targets), int(targets.numel())


@torch.no_grad()
def mean_loss(model: Any, examples: Sequence[Example], pad_id: int, tokens_per_batch: int, autocast: Any) -> float:
    """Token-weighted mean target loss over `examples` (held-out monitoring)."""
    if not examples:
        return float("nan")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for batch in plan_batches([len(e) for e in examples], tokens_per_batch, seed=0, epoch=0):
        input_ids, labels = collate([examples[i] for i in batch], pad_id)
        with autocast():
            loss, n = target_loss(model, input_ids.to(device), labels.to(device))
        total += float(loss) * n
        count += n
    model.train(was_training)
    return total / count


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run depends on; recorded verbatim in the adapter's manifest."""

    base: str = "smollm2"
    data: DataSpec = field(default_factory=DataSpec)
    heldout_items_per_family: int = 8  # for the held-out loss, from stream `heldout_seed`
    heldout_seed: int = 999
    max_len: int = 3072
    tokens_per_batch: int = 49152
    epochs: float = 2.0
    lr: float = 1e-3
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lora: LoraSpec = field(default_factory=LoraSpec)
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"  # "bfloat16": bf16 base weights + autocast, fp32 LoRA weights
    save_dtype: str = "bfloat16"  # adapter weights on disk (halves the file)
    max_steps: int | None = None  # cap on optimizer steps (the cosine schedule ends there)
    time_budget_s: float | None = None  # fit the step count to this budget (`lora_training.fit_steps`)
    log_every: int = 10
    # Share of training examples that also appear with the CoT cut and closed, loss on the
    # answer only (`early_answer_examples`): drafts from a partial CoT, as SSR makes them.
    early_answer_share: float = 0.0

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["data"] = self.data.describe()
        data["lora"] = asdict(self.lora)
        return data

    def optimizer(self) -> OptimizerSettings:
        return OptimizerSettings(
            lr=self.lr,
            warmup_ratio=self.warmup_ratio,
            min_lr_ratio=self.min_lr_ratio,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
        )


@dataclass
class TrainResult:
    steps: int
    planned_steps: int  # after --max-steps / the time budget
    epochs_plan_steps: int  # what `epochs` alone would take
    epochs_done: float
    examples: int
    dropped: dict[str, int]
    target_tokens: int
    padded_tokens: int
    seconds: float
    data_seconds: float
    loss_log: list[dict[str, float]]
    heldout_loss_before: float
    heldout_loss_after: float
    stopped_early: bool
    device_name: str
    versions: dict[str, str]
    thinking_kind: str

    def describe(self) -> dict[str, Any]:
        return asdict(self)


class _LossLog:
    """The step log: the target-token-weighted mean loss of every `every` steps."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.entries: list[dict[str, float]] = []
        self.target_tokens = self.padded_tokens = 0
        self._loss = self._count = 0.0

    def __call__(self, report: StepReport) -> str | None:
        count = report.stats["count"]
        self.target_tokens += count
        self.padded_tokens += report.stats["padded"]
        self._loss += report.stats["loss"] * count
        self._count += count
        if report.step % self.every and report.step != report.planned:
            return None
        entry = {
            "step": report.step,
            "loss": self._loss / self._count,
            "lr": report.lr,
            "seconds": round(report.seconds, 2),
            "tokens_per_s": round(self.padded_tokens / max(report.seconds, 1e-9)),
        }
        self.entries.append(entry)
        self._loss = self._count = 0.0
        return f"step {report.step}/{report.planned} loss {entry['loss']:.4f} lr {report.lr:.2e} {entry['tokens_per_s']} tok/s"


def train_thinker(
    config: TrainConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    fmt: ThinkingFormat | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[Any, TrainResult]:
    """Train a LoRA adapter on `config.data`; return the peft model and what happened.

    Pass `model`/`tokenizer` to train on an already loaded model (tests); otherwise
    `config.base` is loaded with `selfspec.models.load_model`, the same loader that
    later merges the adapter, so the adapter is trained against the very weights it
    will be merged into.
    """
    budget = TimeBudget(config.time_budget_s)
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    dtype = parse_dtype(config.dtype)
    if model is None or tokenizer is None:
        loaded = load_model(config.base, device=device, dtype=dtype)
        model, tokenizer = loaded.model, loaded.tokenizer
        fmt = fmt or loaded.thinking
    else:
        model = model.to(device=device, dtype=dtype)
    fmt = fmt or ThinkingFormat.detect(tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    examples, dropped = encode_examples(tokenizer, fmt, config.data.items(), config.max_len)
    early = early_answer_examples(examples, len(fmt.close_ids), config.early_answer_share, config.seed)
    examples += early
    heldout_spec = replace(config.data, seed=config.heldout_seed, items_per_family=config.heldout_items_per_family)
    heldout, _ = encode_examples(tokenizer, fmt, heldout_spec.items(), config.max_len)
    data_seconds = time.perf_counter() - budget.started
    if not examples:
        raise ValueError(f"no training example fits max_len={config.max_len}")
    log(
        f"data {config.data.version}: {len(examples)} examples ({len(early)} of them early-answer) "
        f"({sum(dropped.values())} over {config.max_len} tokens dropped: {dropped or 'none'}), "
        f"{sum(len(e) for e in examples)} tokens, built in {data_seconds:.1f}s"
    )

    torch.manual_seed(config.seed)  # LoRA init draws from the global generator
    peft_model, trainable = add_lora(model, config.lora)
    log(f"LoRA r={config.lora.r} alpha={config.lora.alpha}: {sum(p.numel() for p in trainable)} trainable parameters")
    autocast = autocast_factory(device, dtype)

    def step(batch: list[int]) -> dict[str, Any]:
        input_ids, labels = collate([examples[i] for i in batch], pad_id)
        with autocast():
            loss, count = target_loss(
                peft_model, input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            )
        loss.backward()
        return {"loss": float(loss.detach()), "count": count, "padded": input_ids.numel()}  # one host sync per step

    lengths = [len(e) for e in examples]
    whole_epochs = math.ceil(config.epochs)
    epochs = [plan_batches(lengths, config.tokens_per_batch, config.seed, epoch) for epoch in range(whole_epochs)]
    steps_per_epoch = len(epochs[0])
    plan = [batch for epoch in epochs for batch in epoch][: max(1, round(config.epochs * steps_per_epoch))]
    padded_per_step = [len(batch) * max(lengths[i] for i in batch) for batch in plan]
    epochs_plan = len(plan)
    planned = epochs_plan if config.max_steps is None else min(epochs_plan, config.max_steps)
    if config.time_budget_s is not None:
        budget_left = budget.left()
        widest = max(range(len(plan)), key=lambda k: max(lengths[i] for i in plan[k]))  # attention grows with length
        tokens_per_s = padded_per_step[widest] / max(step_seconds(peft_model, step, plan[widest], device), 1e-9)
        fitted = fit_steps(padded_per_step[:planned], tokens_per_s, budget_left * BUDGET_SHARE_FOR_STEPS)
        log(
            f"calibration: {tokens_per_s:.0f} padded tokens/s; {fitted} of {planned} steps fit "
            f"{budget_left:.0f}s left of the {config.time_budget_s:.0f}s budget (--max-steps {fitted} reproduces this run)"
        )
        planned = fitted
    plan = plan[:planned]

    heldout_before = mean_loss(peft_model, heldout, pad_id, config.tokens_per_batch, autocast)
    log(f"held-out loss before training: {heldout_before:.4f} ({len(heldout)} examples)")
    loss_log = _LossLog(config.log_every)
    run = run_steps(
        peft_model,
        trainable,
        plan,
        step,
        config.optimizer(),
        should_stop=budget.overrun,
        on_step=loss_log,
        progress=progress,
        log=log,
    )
    if run.stopped_early:
        log(f"{HARD_STOP_FACTOR} x the time budget passed: stopped after {run.steps} of {planned} steps")
    heldout_after = mean_loss(peft_model, heldout, pad_id, config.tokens_per_batch, autocast)
    log(f"held-out loss after training: {heldout_after:.4f}")
    result = TrainResult(
        steps=run.steps,
        planned_steps=planned,
        epochs_plan_steps=epochs_plan,
        epochs_done=run.steps / steps_per_epoch,
        examples=len(examples),
        dropped=dropped,
        target_tokens=loss_log.target_tokens,
        padded_tokens=loss_log.padded_tokens,
        seconds=round(time.perf_counter() - budget.started, 2),
        data_seconds=round(data_seconds, 2),
        loss_log=loss_log.entries,
        heldout_loss_before=heldout_before,
        heldout_loss_after=heldout_after,
        stopped_early=run.stopped_early,
        device_name=device_name(device),
        versions=library_versions(),
        thinking_kind=fmt.kind,
    )
    return peft_model, result


# --------------------------------------------------------------------------- saving


def save_adapter(
    peft_model: Any,
    out_dir: str | Path,
    config: TrainConfig,
    result: TrainResult,
    *,
    description: str | None = None,
    command: str | None = None,
) -> Path:
    """Write the adapter where the registry finds it: peft files + `selfspec_adapter.json`.

    Weights are stored in `config.save_dtype` (the loader merges them into a float32
    base); the manifest records the base, the markers, the data version and the run.
    """
    target = save_lora_weights(peft_model, out_dir, config.save_dtype)
    manifest = {
        "base": config.base,
        "description": description
        or f"{config.base} + thinker LoRA (r={config.lora.r}) trained on {config.data.version} traces",
        "thinking_start": "<think>",
        "thinking_end": "</think>",
        # ChatML: a new turn opened inside the answer ends it (SmolLM2-thinker in fp32 ends some
        # answers with <|im_start|> instead of <|im_end|>). Ignored where the vocabulary lacks it.
        "end_of_turn_tokens": ["<|im_start|>"],
        "data_version": config.data.version,
        "command": command,
        "train_config": config.describe(),
        "training": {key: value for key, value in result.describe().items() if key != "loss_log"},
    }
    (target / ADAPTER_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (target / "loss_log.json").write_text(json.dumps(result.loss_log, indent=1) + "\n")
    return target


def adapter_size_bytes(adapter_dir: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(adapter_dir).iterdir() if f.is_file())


__all__ = [
    "TrainConfig",
    "TrainResult",
    "adapter_size_bytes",
    "mean_loss",
    "save_adapter",
    "target_loss",
    "train_thinker",
]
