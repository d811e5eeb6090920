"""The one training loop of the research code: LoRA adapters (and the arbitrator) trained
step by step under an optional time budget.

Three trainers share it: the thinker's LoRA SFT (`thinker.train`), the distillation of the
shallow draft (`cospec.draft_distill`) and the arbitrator's SFT (`cospec.arbitrator_sft`).
What differs between them is *what one step is*; everything else is here, so they
behave alike and a fix lands in all three:

* **A plan and a step function.** The caller plans every optimizer step up front (one
  payload per step: a length-grouped batch, the packed blocks of a step, a minibatch) and
  gives `run_steps` a function that runs forward and backward for one payload (autocast,
  micro-batches and the loss are its business) and returns the step's numbers.
* **AdamW and a warm-up + cosine schedule** (`make_schedule`: transformers'
  `get_cosine_with_min_lr_schedule_with_warmup`): linear warm-up from 0 over
  `warmup_ratio` of the planned steps, then a half cosine down to `min_lr_ratio` x the
  peak at the last planned step; `min_lr_ratio=1` and no warm-up is a constant rate.
  Planning first lets the schedule end where the run ends.
* **Time budgets are fitted, then enforced.** `step_seconds` times one real step (the
  second of two passes, so one-time costs do not count; no update is made) and
  `fit_steps` keeps the leading steps that fit `BUDGET_SHARE_FOR_STEPS` of the time left;
  the count is recorded, so a run can be repeated without a budget. A run still going at
  `HARD_STOP_FACTOR` x its budget stops (`TimeBudget.overrun`), never before its first
  step: a loaded machine can spend the whole budget on data and calibration, and a run
  that stops before its first step would save an untrained adapter.

LoRA-specific helpers live here too: `add_lora` (a peft LoRA with float32 trainable
weights over a frozen model), `selected_logits` (the vocabulary projection on the rows a
loss needs only) and `save_lora_weights` (the adapter's files as peft reads them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
from tqdm import tqdm

from selfspec.models.loader import parse_dtype

P = TypeVar("P")  # one step's payload

BUDGET_SHARE_FOR_STEPS = 0.9
"""Share of the time left after data building that the fitted steps may use: the rest
covers the held-out evaluation and saving, which the calibration does not time."""
HARD_STOP_FACTOR = 1.15
"""A run still going at this multiple of its time budget stops (and says so)."""


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter's shape: rank, scale, dropout and the modules it wraps."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"


def add_lora(model: torch.nn.Module, spec: LoraSpec) -> tuple[Any, list[torch.nn.Parameter]]:
    """`model` frozen and wrapped in a peft LoRA model; also its trainable parameters.

    The LoRA weights are float32 whatever the model's dtype (bf16 base weights train
    under autocast against fp32 adapters). The tied output head is left alone.
    """
    from peft import LoraConfig, get_peft_model  # heavy: imported when training starts

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model.requires_grad_(False)
    peft_model = get_peft_model(model, config)
    for parameter in peft_model.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
    return peft_model, [p for p in peft_model.parameters() if p.requires_grad]


def autocast_factory(device: torch.device, dtype: torch.dtype) -> Callable[[], contextlib.AbstractContextManager]:
    """A context factory: autocast to `dtype` on `device`, or a disabled autocast for float32."""
    if dtype == torch.float32:
        return lambda: torch.autocast(device_type=device.type, enabled=False)
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for `device` (CUDA work is asynchronous; timing must not stop early)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decoder_and_head(model: Any) -> tuple[Any, Any, float | None]:
    """The transformer body, the output projection and the logit soft-cap, if any."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model
    head = inner.get_output_embeddings()
    config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    return decoder, head, getattr(config, "final_logit_softcapping", None)


def selected_logits(model: Any, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float32 logits [M, V] at the positions `mask` marks.

    Only those rows go through the vocabulary projection: with a 49k vocabulary the full
    [B, T, V] logits of a long batch would dwarf the model. No attention mask is passed:
    batches are right-padded or packed, so causal attention never lets a real token see
    padding, and SDPA keeps its causal fast path.
    """
    decoder, head, softcap = _decoder_and_head(model)
    hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    logits = head(hidden[mask]).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def save_lora_weights(peft_model: Any, directory: str | Path, save_dtype: str, peft_config: Any = None) -> Path:
    """Write `adapter_model.safetensors` (weights in `save_dtype`) and `adapter_config.json`.

    `peft_config` overrides the model's own (e.g. to name the base it was trained on).
    The weights file is made world-readable: safetensors writes 0600, and adapters ship
    in packages.
    """
    from peft.utils import get_peft_model_state_dict  # heavy: imported when saving
    from safetensors.torch import save_file

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    dtype = parse_dtype(save_dtype)
    state = {
        name: t.detach().to("cpu", dtype).contiguous() for name, t in get_peft_model_state_dict(peft_model).items()
    }
    weights = target / "adapter_model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    (peft_config or peft_model.peft_config["default"]).save_pretrained(str(target))
    return target


# --------------------------------------------------------------------------- planning


def token_budget_batches(order: Sequence[int], lengths: Sequence[int], tokens_per_batch: int) -> list[list[int]]:
    """Cut `order` (indices in ascending length) into consecutive batches of at most
    `tokens_per_batch` padded tokens (rows x the longest row); a row longer than the
    budget is a batch of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        width = lengths[index]  # ascending, so the newest row is the widest
        if current and (len(current) + 1) * width > tokens_per_batch:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def fit_steps(costs: Sequence[float], cost_per_s: float, seconds: float) -> int:
    """The most leading steps whose summed `costs` take at most `seconds` at `cost_per_s`
    (at least one: a run always trains)."""
    allowed = cost_per_s * max(seconds, 0.0)
    total, steps = 0.0, 0
    for cost in costs:
        if total + cost > allowed:
            break
        total += cost
        steps += 1
    return max(1, steps)


@dataclass(frozen=True)
class TimeBudget:
    """A wall-clock budget counted from `started` (None: no budget)."""

    seconds: float | None
    started: float = field(default_factory=time.perf_counter)

    def left(self) -> float:
        """Seconds of the budget still unspent (infinite without a budget)."""
        if self.seconds is None:
            return float("inf")
        return self.seconds - (time.perf_counter() - self.started)

    def overrun(self, steps_done: int) -> bool:
        """Whether a run with `steps_done` steps behind it must stop now (module doc)."""
        if self.seconds is None or steps_done == 0:
            return False
        return time.perf_counter() - self.started > HARD_STOP_FACTOR * self.seconds


def step_seconds(model: torch.nn.Module, step_fn: Callable[[P], Any], payload: P, device: torch.device) -> float:
    """Seconds of forward + backward of one real step (`step_fn(payload)`), no update.

    Timed on the second of two passes, so one-time costs (kernel selection, allocator
    growth) do not count; the gradients are dropped afterwards, so training is unchanged.
    """
    model.train()
    seconds = 0.0
    for _ in range(2):
        synchronize(device)
        begun = time.perf_counter()
        step_fn(payload)
        synchronize(device)
        seconds = time.perf_counter() - begun
    model.zero_grad(set_to_none=True)
    return seconds


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and its schedule (module doc); `grad_clip` None: no clipping."""

    lr: float
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 1.0
    weight_decay: float = 0.0
    grad_clip: float | None = None


def make_schedule(optimizer: torch.optim.Optimizer, settings: OptimizerSettings, total_steps: int) -> Any:
    """Linear warm-up over `round(warmup_ratio * total_steps)` steps, then cosine to
    `min_lr_ratio` x the peak at `total_steps` (transformers' scheduler, a `LambdaLR`)."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup  # heavy: imported when training starts

    warmup = round(settings.warmup_ratio * total_steps)
    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=warmup, num_training_steps=total_steps, min_lr_rate=settings.min_lr_ratio
    )


@dataclass(frozen=True)
class StepReport(Generic[P]):
    """One finished optimizer step, as `run_steps` hands it to `on_step`."""

    step: int  # steps done, counting this one
    planned: int
    lr: float  # the rate this step used
    stats: Mapping[str, Any]  # what the step function returned
    grad_norm: torch.Tensor | None  # before clipping (None without clipping)
    seconds: float  # since the loop began
    payload: P


@dataclass(frozen=True)
class LoopResult:
    """What `run_steps` did: steps run of those planned, whether `should_stop` ended it."""

    steps: int
    planned: int
    stopped_early: bool
    seconds: float


def run_steps(
    model: torch.nn.Module,
    parameters: Sequence[torch.nn.Parameter],
    plan: Sequence[P],
    step_fn: Callable[[P], Mapping[str, Any]],
    settings: OptimizerSettings,
    *,
    should_stop: Callable[[int], bool] = lambda steps_done: False,
    on_step: Callable[[StepReport[P]], str | None] = lambda report: None,
    postfix: Callable[[StepReport[P]], Mapping[str, str]] | None = None,
    progress: bool = False,
    desc: str = "train",
    log: Callable[[str], None] = print,
) -> LoopResult:
    """Train `parameters` of `model` through every payload of `plan` (module doc).

    Per step: `should_stop(steps done)` may end the run; `step_fn(payload)` runs forward
    and backward; the gradients are clipped to `settings.grad_clip`; AdamW steps and the
    schedule advances. `on_step` sees every finished step and may return a line to print
    (through the progress bar when there is one, else `log`); `postfix` sets the bar's.
    The model is left in training mode.
    """
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay)
    schedule = make_schedule(optimizer, settings, len(plan))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    started = time.perf_counter()
    steps_done, stopped = 0, False
    with tqdm(total=len(plan), desc=desc, unit="step", disable=not progress) as bar:
        for payload in plan:
            if should_stop(steps_done):
                stopped = True
                break
            lr = optimizer.param_groups[0]["lr"]
            stats = step_fn(payload)
            grad_norm = None
            if settings.grad_clip is not None:
                grad_norm = torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            steps_done += 1
            report = StepReport(steps_done, len(plan), lr, stats, grad_norm, time.perf_counter() - started, payload)
            message = on_step(report)
            bar.update(1)
            if postfix is not None:
                bar.set_postfix(postfix(report), refresh=False)
            if message is not None and progress:
                bar.write(message)
            elif message is not None:
                log(message)
    return LoopResult(steps_done, len(plan), stopped, time.perf_counter() - started)


__all__ = [
    "BUDGET_SHARE_FOR_STEPS",
    "HARD_STOP_FACTOR",
    "LoopResult",
    "LoraSpec",
    "OptimizerSettings",
    "StepReport",
    "TimeBudget",
    "add_lora",
    "autocast_factory",
    "fit_steps",
    "make_schedule",
    "run_steps",
    "save_lora_weights",
    "selected_logits",
    "step_seconds",
    "synchronize",
    "token_budget_batches",
]
