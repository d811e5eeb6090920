"""A distilled shallow self-draft: the target's first N layers + norm + head, with a LoRA
trained to predict the *target's* next-token distribution (LayerSkip / Kangaroo style).

CoSpec's draft must share the target's vocabulary; the shallow self-draft
(`selfspec.spec.draft_model.shallow_draft`) does by construction, but its first N layers
were never trained to be read out by the final norm and head, so it agrees with the target
rarely. Distillation fixes that cheaply: a LoRA on the draft's attention and MLP
projections, trained with KL(teacher || draft) at temperature 1 (optionally plus
cross-entropy on the teacher's argmax) on the thinker's task traces.

Three choices shape this module:

* **The target is never modified.** `own_layers_draft` gives the draft deep copies of the
  first N layers (the embedding, final norm and head stay shared: LoRA never touches them
  and they are frozen), so LoRA injection, training and merging act on the copies only. A
  copy of a layer the engine has fused (`engine.fusion`) carries instance `forward`
  closures that still point at the original module; they are stripped, so the copy runs
  its own weights, and re-fused on the copy when the target was fused.
* **The data is the thinker's** (`selfspec_research.thinker.train`: `DataSpec` + `encode_items`,
  so prompt, `<think>` CoT, the format's `close_ids` and the answer are tokenized exactly
  as the thinker was trained and as the engine prompts). Examples are packed into
  `seq_len`-token blocks (every step is the same shape: no padding, a budget that
  calibrates once); the loss covers positions that predict an assistant token.
* **Held-out agreement is the acceptance proxy**: top-1 agreement between draft and target
  (= greedy SpS acceptance per position), plus KL and E[min(p, q)] (acceptance under
  sampling at temperature 1), on unpacked examples of held-out seeds (each from its own
  start, as at inference), for the plain shallow draft (adapter disabled) and the distilled
  one.

A trained draft is a small directory (`save_distilled_draft`): peft's adapter
(`adapter_config.json`, `adapter_model.safetensors`, keys of a `PeftModel` around the
draft) + `selfspec_draft.json` (base spec, N, shape, a weight signature of the target's
first N layers, LoRA settings, training command, data version/seed, metrics) +
`loss_log.json`. `LLM(model=..., draft="distilled:<dir>")` (or `"layers:N+<dir>"`) loads
it through `load_distilled_draft`, which merges the LoRA into the draft's own layer copies.
"""

from __future__ import annotations

import copy
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfspec.engine.fusion import strip_fusion
from selfspec.thinking.format import ThinkingFormat
from selfspec.spec.distilled_draft import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_FILE,
    DISTILLED_PREFIX,
    FORMAT,
    MANIFEST,
    SIGNATURE_RTOL,
    VERSION,
    _model_shape,
    layer_signature,
    load_distilled_draft,
    load_draft_spec,
    own_layers_draft,
    parse_distilled_spec,
    read_draft_manifest,
    resolve_draft_dir,
    signature_mismatch,
)

LOSS_LOG_FILE = "loss_log.json"
DEFAULT_TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_MODEL = "tiny"  # the random test model of `selfspec.server.cli.load_llm` (qwen3, 2 layers, seed 0)


# --------------------------------------------------------------------------- the draft


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
    temperature: float = 1.0
    data_version: str | None = None  # None: the thinker's default (`selfspec_research.thinker.train.DATA_VERSION`)
    families: tuple[str, ...] | None = None  # None: every family
    knobs: dict[str, dict[str, Any]] | None = None  # custom task knobs (then data_version names them)
    data_seed: int = 0
    max_items_per_family: int = 20000  # cap on generated items; blocks repeat (new epoch) past it
    heldout_seed: int = 1000  # `selfspec_research.thinker.evaluate.HELDOUT_SEED`
    heldout_items_per_family: int = 8
    heldout_max_len: int = 3072  # held-out examples are cut to this many tokens (the thinker's max_len)
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"  # bf16 on CUDA, fp32 on CPU
    save_dtype: str = "float32"
    time_budget_s: float | None = None
    log_every: int = 10

    def __post_init__(self) -> None:
        for name in ("layers", "steps", "batch_size", "grad_accum", "seq_len", "rank", "heldout_items_per_family", "heldout_max_len", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 8:
            raise ValueError(f"seq_len must be >= 8, got {self.seq_len}")
        if self.lr <= 0 or self.temperature <= 0:
            raise ValueError("lr and temperature must be positive")
        if self.kl_weight < 0 or self.ce_weight < 0 or self.kl_weight + self.ce_weight == 0:
            raise ValueError("kl_weight and ce_weight must be >= 0 and not both 0")
        if self.data_seed == self.heldout_seed:
            raise ValueError(f"data_seed and heldout_seed must differ (both {self.data_seed})")
        if self.knobs is not None and not self.data_version:
            raise ValueError("custom knobs need a data_version name, so the draft records which data it saw")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be positive, got {self.time_budget_s}")

    @property
    def lora_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank

    def data_spec(self, seed: int | None = None, items_per_family: int = 1):
        from selfspec_research.thinker.train import DATA_VERSION, DataSpec
        from selfspec_research.thinker.tasks import families as all_families

        seed = self.data_seed if seed is None else seed
        if self.knobs is not None:
            names = tuple(self.families) if self.families is not None else tuple(all_families())
            knobs = {name: dict(self.knobs.get(name, {})) for name in names}
            return DataSpec(families=names, seed=seed, items_per_family=items_per_family, knobs=knobs, version=str(self.data_version))
        return DataSpec.for_version(self.data_version or DATA_VERSION, self.families, seed, items_per_family)

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["target_modules"] = list(self.target_modules)
        data["families"] = list(self.families) if self.families is not None else None
        data["lora_alpha"] = self.lora_alpha
        return data


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' device: CUDA when available; 'auto' dtype: bf16 on CUDA, fp32 elsewhere."""
    from selfspec.models.loader import parse_dtype, resolve_device

    resolved = resolve_device(device)
    if dtype == "auto":
        return resolved, torch.bfloat16 if resolved.type == "cuda" else torch.float32
    return resolved, parse_dtype(dtype)


def load_target(spec: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, ThinkingFormat, str]:
    """(model, tokenizer, thinking format, name) of the teacher."""
    if spec == TINY_MODEL:
        from selfspec.testing.tiny import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        model = tiny_model("qwen3", len(tokenizer), eos_token_id=tokenizer.eos_token_id).to(device=device, dtype=dtype)
        return model, tokenizer, ThinkingFormat.detect(tokenizer), TINY_MODEL
    from selfspec.models.loader import load_model

    loaded = load_model(spec, device=device, dtype=dtype)
    return loaded.model, loaded.tokenizer, loaded.thinking, loaded.name


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Blocks:
    """Packed training data: `ids` [n, seq_len]; `mask` [n, seq_len] marks positions whose
    next token is an assistant token of the same example."""

    ids: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def pack_examples(examples: Sequence[Any], seq_len: int) -> Blocks:
    """Concatenate examples (each ends with EOS) and cut the stream into `seq_len` blocks
    (the remainder is dropped). Attention crosses example boundaries inside a block, as in
    packed pretraining; teacher and draft see the same blocks, so their targets agree."""
    ids: list[int] = []
    predicts: list[bool] = []
    for example in examples:
        tokens = list(example.input_ids)
        n = len(tokens)
        ids += tokens
        # Position t predicts token t + 1: assistant tokens are prompt_len .. n - 1.
        predicts += [example.prompt_len - 1 <= t < n - 1 for t in range(n)]
    count = len(ids) // seq_len
    if count == 0:
        raise ValueError(f"{len(ids)} tokens do not fill one block of {seq_len}")
    used = count * seq_len
    return Blocks(
        torch.tensor(ids[:used], dtype=torch.long).view(count, seq_len),
        torch.tensor(predicts[:used], dtype=torch.bool).view(count, seq_len),
    )


def build_training_blocks(
    config: DistillConfig, tokenizer: Any, fmt: ThinkingFormat, needed_blocks: int, log: Callable[[str], None] = print
) -> tuple[Blocks, dict[str, Any]]:
    """Generate thinker items of `config.data_seed` until they pack into `needed_blocks`
    blocks (or `max_items_per_family` is reached). Items are a pure function of (family,
    seed, index), so the same config regenerates the same blocks."""
    from selfspec_research.thinker.train import encode_items

    families = config.data_spec().families
    needed_tokens = needed_blocks * config.seq_len
    examples: list[Any] = []
    tokens = 0
    start = 0
    chunk = 8
    while tokens < needed_tokens and start < config.max_items_per_family:
        n = min(chunk, config.max_items_per_family - start)
        new = encode_items(tokenizer, fmt, config.data_spec(items_per_family=n).items(start=start))
        examples += new
        tokens += sum(len(e) for e in new)
        start += n
        per_item = tokens / max(1, len(examples))
        missing = max(0, needed_tokens - tokens)
        chunk = max(8, min(4096, math.ceil(missing / per_item / len(families) * 1.05) + 1))
    random.Random(f"draft-distill-examples|{config.data_seed}").shuffle(examples)
    blocks = pack_examples(examples, config.seq_len)
    data = config.data_spec(items_per_family=start).describe()
    data.update(examples=len(examples), tokens=tokens, blocks=len(blocks), loss_positions=int(blocks.mask.sum()))
    return blocks, data


def heldout_examples(config: DistillConfig, tokenizer: Any, fmt: ThinkingFormat) -> list[Any]:
    """Held-out examples (stream `heldout_seed`), each cut to `heldout_max_len` tokens;
    examples whose prompt alone fills that are skipped."""
    from selfspec_research.thinker.train import Example, encode_items

    max_len = config.heldout_max_len
    items = config.data_spec(seed=config.heldout_seed, items_per_family=config.heldout_items_per_family).items()
    out = []
    for example in encode_items(tokenizer, fmt, items):
        if example.prompt_len >= max_len - 1:
            continue  # nothing of the answer fits
        out.append(Example(example.input_ids[:max_len], example.prompt_len, example.family))
    return out


def plan_blocks(num_blocks: int, per_step: int, steps: int, seed: int) -> list[list[int]]:
    """Block indices for each optimizer step: seeded shuffles, a new one per epoch."""
    order: list[int] = []
    epoch = 0
    while len(order) < per_step * steps:
        perm = list(range(num_blocks))
        random.Random(f"draft-distill-blocks|{seed}|{epoch}").shuffle(perm)
        order += perm
        epoch += 1
    return [order[i * per_step : (i + 1) * per_step] for i in range(steps)]


# --------------------------------------------------------------------------- losses


def masked_logits(model: Any, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float32 logits [M, V] at the positions `mask` marks (the head runs on those rows only)."""
    from selfspec_research.thinker.train import _decoder_and_head

    decoder, head, softcap = _decoder_and_head(model)
    hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    logits = head(hidden[mask]).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def distill_loss(
    teacher_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    kl_weight: float = 1.0,
    ce_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """kl_weight * T² KL(teacher_T || draft_T) + ce_weight * CE(draft, argmax teacher), per
    position mean; also the KL, CE and top-1 agreement as floats (one host sync)."""
    t_logp = torch.log_softmax(teacher_logits / temperature, dim=-1)
    d_logp = torch.log_softmax(draft_logits / temperature, dim=-1)
    kl = torch.nn.functional.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean") * temperature**2
    teacher_top = teacher_logits.argmax(-1)
    ce = torch.nn.functional.cross_entropy(draft_logits, teacher_top)
    loss = kl_weight * kl + ce_weight * ce if ce_weight else kl_weight * kl
    agree = (draft_logits.argmax(-1) == teacher_top).float().mean()
    values = torch.stack([loss.detach(), kl.detach(), ce.detach(), agree]).tolist()  # one host sync
    return loss, {"loss": values[0], "kl": values[1], "ce": values[2], "agree": values[3]}


@torch.no_grad()
def agreement_metrics(
    teacher: Any, draft: Any, examples: Sequence[Any], pad_id: int, batch_size: int, autocast: Callable[[], Any]
) -> dict[str, Any]:
    """Draft vs target over the assistant positions of `examples` (unpacked, right padded):
    top-1 agreement, KL(target || draft), E[min(p, q)] (acceptance under sampling at T=1);
    overall (position-weighted) and per family."""
    from selfspec_research.thinker.train import collate

    device = next(teacher.parameters()).device
    sums: dict[str, list[float]] = {}
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]))
    was_training = draft.training
    draft.eval()
    for begin in range(0, len(order), batch_size):
        batch = [examples[i] for i in order[begin : begin + batch_size]]
        input_ids, labels = collate(batch, pad_id)
        mask = labels != -100
        input_ids, mask = input_ids.to(device), mask.to(device)
        with autocast():
            t = masked_logits(teacher, input_ids, mask)
            d = masked_logits(draft, input_ids, mask)
        p, q = torch.softmax(t, -1), torch.softmax(d, -1)
        kl = (p * (torch.log_softmax(t, -1) - torch.log_softmax(d, -1))).sum(-1)
        overlap = torch.minimum(p, q).sum(-1)
        agree = (t.argmax(-1) == d.argmax(-1)).float()
        rows = torch.stack([agree, kl, overlap], dim=1).cpu()
        counts = mask.sum(1).tolist()
        start = 0
        for example, count in zip(batch, counts):
            part = rows[start : start + count].double().sum(0).tolist()
            start += count
            for key in (example.family, "all"):
                acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
                acc[0] += part[0]
                acc[1] += part[1]
                acc[2] += part[2]
                acc[3] += count
    draft.train(was_training)
    out: dict[str, Any] = {}
    for key, (agree_sum, kl_sum, overlap_sum, n) in sums.items():
        out[key] = {
            "positions": int(n),
            "top1_agreement": round(agree_sum / n, 5) if n else None,
            "kl": round(kl_sum / n, 5) if n else None,
            "expected_acceptance": round(overlap_sum / n, 5) if n else None,
        }
    return out


# --------------------------------------------------------------------------- training


@dataclass
class DistillResult:
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


BUDGET_SHARE_FOR_STEPS = 0.9
HARD_STOP_FACTOR = 1.15


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
    from selfspec.run_info import device_name, library_versions
    from selfspec_research.thinker.train import LoraSpec, _autocast_factory, _synchronize, add_lora, lr_at

    started = time.perf_counter()
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
        raise ValueError(f"--layers must be in [1, {total_layers - 1}] for this {total_layers}-layer target, got {config.layers}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    load_seconds = time.perf_counter() - started
    data_started = time.perf_counter()
    per_step = config.batch_size * config.grad_accum
    blocks, data = build_training_blocks(config, tokenizer, fmt, per_step * config.steps, log)
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
    draft = own_layers_draft(target, config.layers)
    lora = LoraSpec(r=config.rank, alpha=config.lora_alpha, dropout=config.dropout, target_modules=tuple(config.target_modules))
    peft_draft = add_lora(draft, lora)
    for parameter in peft_draft.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
    trainable = [p for p in peft_draft.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    log(f"draft: {config.layers} of {total_layers} layers + norm + head; LoRA r={config.rank} alpha={config.lora_alpha} on {','.join(config.target_modules)}: {n_trainable} trainable parameters")
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    autocast = _autocast_factory(device, dtype)

    # Held-out batches hold about as many tokens as a training micro-batch (same memory).
    heldout_batch = max(1, config.batch_size * config.seq_len // max(config.heldout_max_len, 1))
    eval_started = time.perf_counter()
    with peft_draft.disable_adapter():
        plain = agreement_metrics(target, peft_draft, heldout, pad_id, heldout_batch, autocast)
    eval_seconds = time.perf_counter() - eval_started
    log(f"held-out, plain shallow draft: {_fmt_metrics(plain)}")

    def micro_step(indices: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        ids = blocks.ids[indices].to(device, non_blocking=True)
        mask = blocks.mask[indices].to(device, non_blocking=True)
        with autocast():
            with torch.no_grad():
                teacher_logits = masked_logits(target, ids, mask)
            draft_logits = masked_logits(peft_draft, ids, mask)
        return distill_loss(
            teacher_logits, draft_logits, temperature=config.temperature, kl_weight=config.kl_weight, ce_weight=config.ce_weight
        )

    def micro_batches(indices: list[int]) -> list[tuple[list[int], float]]:
        """The step's micro-batches, each weighted by its share of the step's loss positions
        (the losses are per-position means), so accumulation equals one large batch."""
        parts = [indices[i : i + config.batch_size] for i in range(0, len(indices), config.batch_size)]
        counts = [int(blocks.mask[part].sum()) for part in parts]
        total = max(1, sum(counts))
        return [(part, count / total) for part, count in zip(parts, counts) if count]

    planned = config.steps
    schedule = plan_blocks(len(blocks), per_step, planned, config.seed)
    if config.time_budget_s is not None:
        peft_draft.train()
        seconds = 0.0
        for _ in range(2):  # the second pass is timed: one-time costs do not count
            _synchronize(device)
            begun = time.perf_counter()
            for micro_indices, weight in micro_batches(schedule[0]):
                loss, _ = micro_step(micro_indices)
                (loss * weight).backward()
            _synchronize(device)
            seconds = time.perf_counter() - begun
        peft_draft.zero_grad(set_to_none=True)
        left = config.time_budget_s - (time.perf_counter() - started) - eval_seconds
        fitted = max(1, int(left * BUDGET_SHARE_FOR_STEPS / max(seconds, 1e-9)))
        log(
            f"calibration: {seconds * 1000:.0f} ms per step; {min(fitted, planned)} of {planned} steps fit "
            f"{left:.0f}s left of the {config.time_budget_s:.0f}s budget (--steps {min(fitted, planned)} reproduces the schedule)"
        )
        planned = min(planned, fitted)
        schedule = schedule[:planned]
    warmup = round(config.warmup_ratio * planned)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=planned, desc="distil", unit="step")
    peft_draft.train()
    loss_log: list[dict[str, float]] = []
    stopped_early = False
    steps_done = 0
    train_started = time.perf_counter()
    for step, indices in enumerate(schedule):
        # Never before the first step: the calibration plans at least one, and a run that stops
        # before it would save an untrained draft (seen once: the test suite beside another job on 2 cores).
        if step > 0 and config.time_budget_s is not None and time.perf_counter() - started > HARD_STOP_FACTOR * config.time_budget_s:
            stopped_early = True
            log(f"{HARD_STOP_FACTOR} x the time budget passed: stopping after {step} of {planned} steps")
            break
        lr = lr_at(step, planned, warmup, config.lr, config.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        totals = {"loss": 0.0, "kl": 0.0, "ce": 0.0, "agree": 0.0}
        for micro_indices, weight in micro_batches(indices):
            loss, stats = micro_step(micro_indices)
            (loss * weight).backward()
            for key in totals:
                totals[key] += stats[key] * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_done = step + 1
        positions = int(blocks.mask[indices].sum())  # 0: every block of the step lies in prompts (no update)
        entry = {
            "step": steps_done,
            "lr": lr,
            **{k: round(v, 6) for k, v in totals.items()},
            "grad_norm": round(float(grad_norm), 4),
            "positions": positions,
        }
        loss_log.append(entry)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{entry['loss']:.4f}", agree=f"{entry['agree']:.3f}")
        if steps_done % config.log_every == 0 or steps_done == planned or steps_done == 1:
            elapsed = time.perf_counter() - train_started
            message = (
                f"step {steps_done}/{planned} loss {entry['loss']:.4f} kl {entry['kl']:.4f} ce {entry['ce']:.4f} "
                f"agree {entry['agree']:.3f} lr {lr:.2e} {steps_done * per_step * config.seq_len / max(elapsed, 1e-9):.0f} tok/s"
            )
            if bar is not None:
                bar.write(message)
            else:
                log(message)
    if bar is not None:
        bar.close()
    _synchronize(device)
    train_seconds = time.perf_counter() - train_started
    peft_draft.eval()
    distilled = agreement_metrics(target, peft_draft, heldout, pad_id, heldout_batch, autocast)
    log(f"held-out, plain shallow draft:     {_fmt_metrics(plain)}")
    log(f"held-out, distilled shallow draft: {_fmt_metrics(distilled)}")
    result = DistillResult(
        model=name,
        layers=config.layers,
        steps=steps_done,
        planned_steps=planned,
        stopped_early=stopped_early,
        data=data,
        heldout_examples=len(heldout),
        heldout_plain=plain,
        heldout_distilled=distilled,
        trainable_parameters=n_trainable,
        seconds=round(time.perf_counter() - started, 2),
        load_seconds=round(load_seconds, 2),
        data_seconds=round(data_seconds, 2),
        train_seconds=round(train_seconds, 2),
        tokens_per_s=round(steps_done * per_step * config.seq_len / max(train_seconds, 1e-9), 1),
        device_name=device_name(device),
        dtype=str(dtype).removeprefix("torch."),
        versions=library_versions(),
        loss_log=loss_log,
    )
    return target, peft_draft, result


def _fmt_metrics(metrics: dict[str, Any]) -> str:
    overall = metrics.get("all", {})
    return (
        f"top-1 agreement {overall.get('top1_agreement')}, KL {overall.get('kl')}, "
        f"E[min(p,q)] {overall.get('expected_acceptance')} over {overall.get('positions')} positions"
    )


# --------------------------------------------------------------------------- save / load


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
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from selfspec.models.loader import parse_dtype

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    save_dtype = parse_dtype(config.save_dtype)
    state = {k: v.detach().to("cpu", save_dtype).contiguous() for k, v in get_peft_model_state_dict(peft_draft).items()}
    weights = directory / ADAPTER_FILE
    save_file(state, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    peft_config = copy.copy(peft_draft.peft_config["default"])
    peft_config.base_model_name_or_path = f"{result.model if result is not None else config.model} (first {config.layers} layers)"
    peft_config.save_pretrained(str(directory))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "base": result.model if result is not None else config.model,
        "layers": config.layers,
        **_model_shape(target),
        "signature": layer_signature(target, config.layers),
        "lora": {
            "r": config.rank,
            "alpha": config.lora_alpha,
            "dropout": config.dropout,
            "target_modules": list(config.target_modules),
        },
        "loss": {"kl_weight": config.kl_weight, "ce_weight": config.ce_weight, "temperature": config.temperature},
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
    from peft.tuners.tuners_utils import BaseTunerLayer

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
    "Blocks",
    "DistillConfig",
    "DistillResult",
    "agreement_metrics",
    "build_training_blocks",
    "distill_loss",
    "heldout_examples",
    "layer_signature",
    "load_distilled_draft",
    "load_draft_spec",
    "masked_logits",
    "merged_copy",
    "own_layers_draft",
    "pack_examples",
    "parse_distilled_spec",
    "read_draft_manifest",
    "save_distilled_draft",
    "train_distilled_draft",
]
