"""A distilled shallow self-draft: the target's first N layers + norm + head, with a LoRA
trained to predict the *target's* next-token distribution (LayerSkip / Kangaroo style).

CoSpec's draft must share the target's vocabulary; the shallow self-draft
(`selfspec.spec.draft_model.shallow_draft`) does by construction, but its first N layers
were never trained to be read out by the final norm and head, so it agrees with the target
rarely. Distillation fixes that cheaply: a LoRA on the draft's attention and MLP
projections, trained with KL(teacher || draft) at temperature 1 (optionally plus
cross-entropy on the teacher's argmax) on the thinker's task traces.

A draft can instead (or as well) learn the tasks themselves: `reference_weight` puts
cross-entropy on the traces' reference tokens, the labels the thinker was trained on. A
draft that only imitates its target can never solve an item the target fails; one trained
on the references can, which is the complementarity CoSpec's arbitrator needs.

Three choices shape it:

* **The target is never modified.** `own_layers_draft` gives the draft deep copies of the
  first N layers (the embedding, final norm and head stay shared: LoRA never touches them
  and they are frozen), so LoRA injection, training and merging act on the copies only. A
  copy of a layer the engine has fused (`engine.fusion`) carries instance `forward`
  closures that still point at the original module; they are stripped, so the copy runs
  its own weights, and re-fused on the copy when the target was fused.
* **The data is the thinker's**, packed into same-shape blocks (`cospec.distill_data`),
  and the loop is the shared one (`selfspec_research.lora_training`), with micro-batches
  weighted so that gradient accumulation equals one large batch.
* **Held-out agreement is the acceptance proxy** (`cospec.distill_metrics`), measured for
  the plain shallow draft (adapter disabled) and the distilled one.

A trained draft is a small directory (`save_distilled_draft`): peft's adapter
(`adapter_config.json`, `adapter_model.safetensors`, keys of a `PeftModel` around the
draft) + `selfspec_draft.json` (base spec, N, shape, a weight signature of the target's
first N layers, LoRA settings, training command, data version/seed, metrics) +
`loss_log.json`. `LLM(model=..., draft="distilled:<dir>")` (or `"layers:N+<dir>"`) loads
it through `selfspec.spec.distilled_draft.load_distilled_draft`, which merges the LoRA into
the draft's own layer copies.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfspec.models.loader import load_model, parse_dtype, resolve_device
from selfspec.run_info import device_name, library_versions
from selfspec.spec.distilled_draft import FORMAT, MANIFEST, VERSION, _model_shape, layer_signature, own_layers_draft
from selfspec.thinking.format import ThinkingFormat
from selfspec_research.cospec.distill_data import build_training_blocks, heldout_examples, plan_blocks
from selfspec_research.cospec.distill_metrics import agreement_metrics, describe_agreement, distill_loss
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
    synchronize,
)
from selfspec_research.thinker.data_versions import DATA_VERSION, HELDOUT_SEED
from selfspec_research.thinker.examples import DataSpec
from selfspec_research.thinker.tasks import families as all_families

LOSS_LOG_FILE = "loss_log.json"
DEFAULT_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_MODEL = "tiny"  # the random test model of `selfspec.server.cli.load_llm` (qwen3, 2 layers, seed 0)


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DistillConfig:
    """Everything a distillation run depends on; recorded in the draft's manifest."""

    model: str = "smollm2-thinker"  # the target (teacher): a model spec for `load_model`, or "tiny"
    layers: int = 8
    steps: int = 600  # optimizer steps (the cosine schedule ends there); a time budget may cut it
    batch_size: int = 8  # blocks per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    seq_len: int = 1024
    lr: float = 1e-3
    warmup_ratio: float = 0.05
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    rank: int = 32
    alpha: int | None = None  # None: 2 * rank
    dropout: float = 0.0
    target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    kl_weight: float = 1.0
    ce_weight: float = 0.0  # cross-entropy on the teacher's argmax, added to the KL
    reference_weight: float = 0.0  # cross-entropy on the data's reference tokens (learns the tasks, not the target)
    temperature: float = 1.0
    data_version: str | None = None  # None: the thinker's default (`thinker.data_versions.DATA_VERSION`)
    families: tuple[str, ...] | None = None  # None: every family
    knobs: dict[str, dict[str, Any]] | None = None  # custom task knobs (then data_version names them)
    data_seed: int = 0
    max_items_per_family: int = 20000  # cap on generated items; blocks repeat (new epoch) past it
    heldout_seed: int = HELDOUT_SEED
    heldout_items_per_family: int = 8
    heldout_max_len: int = 3072  # held-out examples are cut to this many tokens (the thinker's max_len)
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"  # bf16 on CUDA, fp32 on CPU
    save_dtype: str = "float32"
    time_budget_s: float | None = None
    log_every: int = 10

    def __post_init__(self) -> None:
        for name in (
            "layers",
            "steps",
            "batch_size",
            "grad_accum",
            "seq_len",
            "rank",
            "heldout_items_per_family",
            "heldout_max_len",
            "log_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 8:
            raise ValueError(f"seq_len must be >= 8, got {self.seq_len}")
        if self.lr <= 0 or self.temperature <= 0:
            raise ValueError("lr and temperature must be positive")
        weights = (self.kl_weight, self.ce_weight, self.reference_weight)
        if min(weights) < 0 or sum(weights) == 0:
            raise ValueError("kl_weight, ce_weight and reference_weight must be >= 0 and not all 0")
        if self.data_seed == self.heldout_seed:
            raise ValueError(f"data_seed and heldout_seed must differ (both {self.data_seed})")
        if self.knobs is not None and not self.data_version:
            raise ValueError("custom knobs need a data_version name, so the draft records which data it saw")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be positive, got {self.time_budget_s}")

    @property
    def lora_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank

    def lora(self) -> LoraSpec:
        return LoraSpec(
            r=self.rank, alpha=self.lora_alpha, dropout=self.dropout, target_modules=tuple(self.target_modules)
        )

    def optimizer(self) -> OptimizerSettings:
        return OptimizerSettings(
            lr=self.lr,
            warmup_ratio=self.warmup_ratio,
            min_lr_ratio=self.min_lr_ratio,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
        )

    def data_spec(self, seed: int | None = None, items_per_family: int = 1) -> DataSpec:
        seed = self.data_seed if seed is None else seed
        if self.knobs is not None:
            names = tuple(self.families) if self.families is not None else tuple(all_families())
            knobs = {name: dict(self.knobs.get(name, {})) for name in names}
            return DataSpec(
                families=names,
                seed=seed,
                items_per_family=items_per_family,
                knobs=knobs,
                version=str(self.data_version),
            )
        return DataSpec.for_version(self.data_version or DATA_VERSION, self.families, seed, items_per_family)

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        data["families"] = list(self.families) if self.families is not None else None
        data["lora_alpha"] = self.lora_alpha
        return data


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' device: CUDA when available; 'auto' dtype: bf16 on CUDA, fp32 elsewhere."""
    resolved = resolve_device(device)
    if dtype == "auto":
        return resolved, torch.bfloat16 if resolved.type == "cuda" else torch.float32
    return resolved, parse_dtype(dtype)


def load_target(spec: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, ThinkingFormat, str]:
    """(model, tokenizer, thinking format, name) of the teacher."""
    if spec == TINY_MODEL:
        from selfspec.testing.tiny import (  # slow to import (every model class): only `tiny` needs it
            tiny_model,
            tiny_tokenizer,
        )

        tokenizer = tiny_tokenizer()
        model = tiny_model("qwen3", len(tokenizer), eos_token_id=tokenizer.eos_token_id).to(device=device, dtype=dtype)
        return model, tokenizer, ThinkingFormat.detect(tokenizer), TINY_MODEL
    loaded = load_model(spec, device=device, dtype=dtype)
    return loaded.model, loaded.tokenizer, loaded.thinking, loaded.name


# --------------------------------------------------------------------------- training


@dataclass
class DistillResult:
    """What a distillation run did and measured (recorded in the draft's manifest)."""

    model: str
    layers: int
    steps: int
    planned_steps: int
    stopped_early: bool
    data: dict[str, Any]
    heldout_examples: int
    heldout_plain: dict[str, Any]
    heldout_distilled: dict[str, Any]
    trainable_parameters: int
    seconds: float
    load_seconds: float
    data_seconds: float
    train_seconds: float
    tokens_per_s: float
    device_name: str
    dtype: str
    versions: dict[str, str]
    loss_log: list[dict[str, float]] = field(default_factory=list)

    def describe(self, *, with_log: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_log:
            data.pop("loss_log")
        return data


def train_distilled_draft(
    config: DistillConfig,
    *,
    target: Any = None,
    tokenizer: Any = None,
    fmt: ThinkingFormat | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[Any, Any, DistillResult]:
    """Distil a LoRA into the first `config.layers` layers of the target; returns (target,
    peft draft, result). Pass `target`/`tokenizer` to use a loaded model (tests); otherwise
    `config.model` is loaded (the same loader `LLM` uses, so the draft is trained against
    the weights it will be merged beside)."""
    budget = TimeBudget(config.time_budget_s)
    device, dtype = resolve_device_dtype(config.device, config.dtype)
    name = config.model
    if target is None or tokenizer is None:
        target, tokenizer, loaded_fmt, name = load_target(config.model, device, dtype)
        fmt = fmt or loaded_fmt
    else:
        target = target.to(device=device, dtype=dtype)
    fmt = fmt or ThinkingFormat.detect(tokenizer)
    target.eval()
    target.requires_grad_(False)
    total_layers = len(target.model.layers)
    if not 1 <= config.layers < total_layers:
        raise ValueError(
            f"--layers must be in [1, {total_layers - 1}] for this {total_layers}-layer target, got {config.layers}"
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    load_seconds = time.perf_counter() - budget.started
    data_started = time.perf_counter()
    per_step = config.batch_size * config.grad_accum
    blocks, data = build_training_blocks(config, tokenizer, fmt, per_step * config.steps)
    heldout = heldout_examples(config, tokenizer, fmt)
    if not heldout:
        log(f"warning: no held-out example fits {config.heldout_max_len} tokens: no agreement numbers")
    data_seconds = time.perf_counter() - data_started
    log(
        f"data {data['version']}: {data['examples']} examples ({data['items_per_family']} per family, seed "
        f"{config.data_seed}), {data['tokens']} tokens -> {len(blocks)} blocks of {config.seq_len} "
        f"({data['loss_positions']} loss positions); {len(heldout)} held-out examples (seed {config.heldout_seed}); "
        f"{data_seconds:.1f}s"
    )

    torch.manual_seed(config.seed)  # LoRA init draws from the global generator
    peft_draft, trainable = add_lora(own_layers_draft(target, config.layers), config.lora())
    n_trainable = sum(p.numel() for p in trainable)
    log(
        f"draft: {config.layers} of {total_layers} layers + norm + head; LoRA r={config.rank} alpha={config.lora_alpha} "
        f"on {','.join(config.target_modules)}: {n_trainable} trainable parameters"
    )
    autocast = autocast_factory(device, dtype)

    # Held-out batches hold about as many tokens as a training micro-batch (same memory).
    heldout_batch = max(1, config.batch_size * config.seq_len // max(config.heldout_max_len, 1))
    eval_started = time.perf_counter()
    with peft_draft.disable_adapter():
        plain = agreement_metrics(target, peft_draft, heldout, pad_id, heldout_batch, autocast)
    eval_seconds = time.perf_counter() - eval_started
    log(f"held-out, plain shallow draft: {describe_agreement(plain)}")

    def step(indices: list[int]) -> dict[str, float]:
        """Forward + backward of one step's blocks, micro-batch by micro-batch. Each
        micro-batch is weighted by its share of the step's loss positions (the losses are
        per-position means), so accumulation equals one large batch."""
        parts = [indices[i : i + config.batch_size] for i in range(0, len(indices), config.batch_size)]
        counts = [int(blocks.mask[part].sum()) for part in parts]
        total = max(1, sum(counts))
        totals = {"loss": 0.0, "kl": 0.0, "ce": 0.0, "ref": 0.0, "agree": 0.0}
        for part, count in zip(parts, counts):
            if not count:
                continue
            weight = count / total
            ids = blocks.ids[part].to(device, non_blocking=True)
            mask = blocks.mask[part].to(device, non_blocking=True)
            reference = blocks.targets[part][blocks.mask[part]].to(device, non_blocking=True)
            with autocast():
                with torch.no_grad():
                    teacher_logits = selected_logits(target, ids, mask)
                draft_logits = selected_logits(peft_draft, ids, mask)
            loss, stats = distill_loss(
                teacher_logits,
                draft_logits,
                temperature=config.temperature,
                kl_weight=config.kl_weight,
                ce_weight=config.ce_weight,
                reference=reference,
                reference_weight=config.reference_weight,
            )
            (loss * weight).backward()
            for key in totals:
                totals[key] += stats[key] * weight
        return totals

    planned = config.steps
    plan = plan_blocks(len(blocks), per_step, planned, config.seed)
    if config.time_budget_s is not None:
        seconds = step_seconds(peft_draft, step, plan[0], device)
        left = budget.left() - eval_seconds  # the distilled draft's held-out pass costs about what the plain one did
        fitted = fit_steps([1] * planned, 1.0 / max(seconds, 1e-9), left * BUDGET_SHARE_FOR_STEPS)
        log(
            f"calibration: {seconds * 1000:.0f} ms per step; {fitted} of {planned} steps fit "
            f"{left:.0f}s left of the {config.time_budget_s:.0f}s budget (--steps {fitted} reproduces the schedule)"
        )
        planned = fitted
        plan = plan[:planned]

    loss_log: list[dict[str, float]] = []

    def record(report: StepReport) -> str | None:
        entry = {
            "step": report.step,
            "lr": report.lr,
            **{k: round(v, 6) for k, v in report.stats.items()},
            "grad_norm": round(float(report.grad_norm), 4),
            "positions": int(blocks.mask[report.payload].sum()),  # 0: every block of the step lies in prompts
        }
        loss_log.append(entry)
        if report.step % config.log_every and report.step not in (1, report.planned):
            return None
        tokens_per_s = report.step * per_step * config.seq_len / max(report.seconds, 1e-9)
        return (
            f"step {report.step}/{report.planned} loss {entry['loss']:.4f} kl {entry['kl']:.4f} ce {entry['ce']:.4f} "
            f"ref {entry['ref']:.4f} agree {entry['agree']:.3f} lr {report.lr:.2e} {tokens_per_s:.0f} tok/s"
        )

    train_started = time.perf_counter()
    run = run_steps(
        peft_draft,
        trainable,
        plan,
        step,
        config.optimizer(),
        should_stop=budget.overrun,
        on_step=record,
        postfix=lambda r: {"loss": f"{r.stats['loss']:.4f}", "agree": f"{r.stats['agree']:.3f}"},
        progress=progress,
        desc="distil",
        log=log,
    )
    if run.stopped_early:
        log(f"{HARD_STOP_FACTOR} x the time budget passed: stopped after {run.steps} of {planned} steps")
    synchronize(device)
    train_seconds = time.perf_counter() - train_started
    peft_draft.eval()
    distilled = agreement_metrics(target, peft_draft, heldout, pad_id, heldout_batch, autocast)
    log(f"held-out, plain shallow draft:     {describe_agreement(plain)}")
    log(f"held-out, distilled shallow draft: {describe_agreement(distilled)}")
    result = DistillResult(
        model=name,
        layers=config.layers,
        steps=run.steps,
        planned_steps=planned,
        stopped_early=run.stopped_early,
        data=data,
        heldout_examples=len(heldout),
        heldout_plain=plain,
        heldout_distilled=distilled,
        trainable_parameters=n_trainable,
        seconds=round(time.perf_counter() - budget.started, 2),
        load_seconds=round(load_seconds, 2),
        data_seconds=round(data_seconds, 2),
        train_seconds=round(train_seconds, 2),
        tokens_per_s=round(run.steps * per_step * config.seq_len / max(train_seconds, 1e-9), 1),
        device_name=device_name(device),
        dtype=str(dtype).removeprefix("torch."),
        versions=library_versions(),
        loss_log=loss_log,
    )
    return target, peft_draft, result


# --------------------------------------------------------------------------- saving


def save_distilled_draft(
    peft_draft: Any,
    out_dir: str | Path,
    *,
    target: torch.nn.Module,
    config: DistillConfig,
    result: DistillResult | None = None,
    command: str | None = None,
) -> Path:
    """Write the draft's adapter (peft files) + `selfspec_draft.json` + `loss_log.json`."""
    base = result.model if result is not None else config.model
    peft_config = copy.copy(peft_draft.peft_config["default"])
    peft_config.base_model_name_or_path = f"{base} (first {config.layers} layers)"
    directory = save_lora_weights(peft_draft, out_dir, config.save_dtype, peft_config)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "base": base,
        "layers": config.layers,
        **_model_shape(target),
        "signature": layer_signature(target, config.layers),
        "lora": {
            "r": config.rank,
            "alpha": config.lora_alpha,
            "dropout": config.dropout,
            "target_modules": list(config.target_modules),
        },
        "loss": {
            "kl_weight": config.kl_weight,
            "ce_weight": config.ce_weight,
            "reference_weight": config.reference_weight,
            "temperature": config.temperature,
        },
        "command": command,
        "data": result.data if result is not None else config.data_spec().describe(),
        "config": config.describe(),
        "metrics": (
            {"heldout_plain": result.heldout_plain, "heldout_distilled": result.heldout_distilled}
            if result is not None
            else {}
        ),
        "training": result.describe() if result is not None else {},
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if result is not None:
        (directory / LOSS_LOG_FILE).write_text(json.dumps(result.loss_log, indent=1) + "\n")
    return directory


def merged_copy(peft_draft: Any) -> torch.nn.Module:
    """A merged draft from a trained peft draft, leaving the peft draft as it is (the LoRA
    layers are deep-copied first; shared embedding/norm/head stay shared)."""
    from peft.tuners.tuners_utils import BaseTunerLayer  # heavy: imported when a draft is merged

    base = peft_draft.get_base_model()
    clone = copy.copy(base)
    clone._modules = dict(base._modules)
    inner = copy.copy(base.model)
    inner._modules = dict(base.model._modules)
    inner.layers = copy.deepcopy(base.model.layers)
    clone.model = inner
    for module in inner.layers.modules():
        if hasattr(module, "merge") and hasattr(module, "base_layer"):
            module.merge()

    def unwrap(parent: torch.nn.Module) -> None:
        for child_name, child in list(parent.named_children()):
            if isinstance(child, BaseTunerLayer):
                setattr(parent, child_name, child.get_base_layer())
            else:
                unwrap(child)

    unwrap(inner.layers)
    clone.eval()
    clone.requires_grad_(False)
    return clone


__all__ = [
    "DistillConfig",
    "DistillResult",
    "load_target",
    "merged_copy",
    "resolve_device_dtype",
    "save_distilled_draft",
    "train_distilled_draft",
]
