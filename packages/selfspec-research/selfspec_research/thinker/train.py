"""LoRA training of a small "thinker" on the seeded think→answer traces.

No reasoning model is reachable offline, so the testbed makes one: a base model (by
default SmolLM2-135M-Instruct) learns, through a LoRA adapter on every linear layer,
to write a chain of thought inside `<think>` … `</think>` and then an answer that the
CoT has already built piece by piece. That is the property SSR needs to be measured
honestly: a draft forked mid-thought should already hold part of the final answer.

Three choices shape this module:

* **Data is a generator plus a seed, never files.** `DataSpec` names the families,
  their difficulty knobs (`DATA_VERSION` pins the defaults), the seed and the count;
  any machine regenerates the same examples bit for bit, so the GPU run carries no
  data and the held-out split is just another seed.
* **The token boundaries are the engine's.** The prompt is tokenized exactly as
  `build_prompt_ids` tokenizes it at inference (chat template, then the opening
  marker for prompted-thinking models), and the CoT is closed with the format's
  `close_ids`: the tokens the engine appends when it closes thinking by force or
  forks an SSR draft. A draft therefore sees the very boundary the model learned.
* **Loss on the assistant part only**, computed from hidden states at target
  positions (the vocabulary projection runs on those rows only), with batches
  grouped by length and right padding, so plain causal attention needs no mask.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from selfspec.models.registry import ADAPTER_MANIFEST
from selfspec.thinking.format import ThinkingFormat, build_prompt_text
from selfspec.run_info import device_name, library_versions
from selfspec_research.thinker.tasks import TaskItem, families as all_families, format_training_text, generate_split

from selfspec_research.thinker.data_versions import (  # noqa: F401  (re-exported: the training API)
    DATA_VERSION, DATA_VERSION_V2, DATA_VERSION_V3, DATA_VERSIONS, DEFAULT_TASK_KNOBS, TRAIN_SEED, V2_TASK_KNOBS, V3_TASK_KNOBS, data_version_knobs,
)

IGNORE_INDEX = -100


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class DataSpec:
    """Which items to generate: `items_per_family` items of each family from stream `seed`."""

    families: tuple[str, ...] = tuple(all_families())
    seed: int = TRAIN_SEED
    items_per_family: int = 1500
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: DEFAULT_TASK_KNOBS)
    version: str = DATA_VERSION

    @classmethod
    def for_version(
        cls,
        version: str = DATA_VERSION,
        families: Sequence[str] | None = None,
        seed: int = TRAIN_SEED,
        items_per_family: int = 1500,
    ) -> "DataSpec":
        """The spec of built-in data version `version` (see `DATA_VERSIONS`)."""
        return cls(
            families=tuple(families) if families is not None else tuple(all_families()),
            seed=seed,
            items_per_family=items_per_family,
            knobs=data_version_knobs(version),
            version=version,
        )

    def items(self, start: int = 0) -> list[TaskItem]:
        knobs = {name: dict(self.knobs.get(name, {})) for name in self.families}
        return generate_split(list(self.families), self.seed, self.items_per_family, knobs=knobs, start=start)

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "families": list(self.families),
            "seed": self.seed,
            "items_per_family": self.items_per_family,
            "knobs": {name: dict(self.knobs.get(name, {})) for name in self.families},
        }


@dataclass(frozen=True)
class Example:
    """One tokenized trace: `input_ids` = prompt + CoT + close marker + answer + EOS.

    The loss covers positions >= `target_start`: the whole target (`prompt_len`), or only
    the answer for an early-answer example (`early_answer_examples`).
    """

    input_ids: tuple[int, ...]
    prompt_len: int
    family: str
    cot_len: int = 0  # CoT tokens right after the prompt (the close marker follows them)
    loss_start: int | None = None  # None: the target starts at prompt_len

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def target_start(self) -> int:
        return self.prompt_len if self.loss_start is None else self.loss_start


def _split_target(tokenizer: Any, fmt: ThinkingFormat, item: TaskItem) -> tuple[str, bool, str, str]:
    """(prompt text, whether it takes special tokens, CoT part, answer) of one item."""
    messages, target = format_training_text(item)
    prompt_text, raw = build_prompt_text(tokenizer, messages, fmt, enable_thinking=True)
    opened = f"{fmt.start_marker}\n"
    if fmt.kind == "prompted" and prompt_text.endswith(opened):
        if not target.startswith(opened):
            raise ValueError(f"training target does not open with {opened!r}")
        target = target[len(opened):]
    close_text = f"\n{fmt.end_marker}\n\n"
    head, separator, answer = target.rpartition(close_text)
    if not separator:
        raise ValueError(f"training target of {item.uid} has no {close_text!r}")
    return prompt_text, raw, head, answer


def _batch_encode(tokenizer: Any, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
    if not texts:
        return []
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]]


def encode_items(tokenizer: Any, fmt: ThinkingFormat, items: Sequence[TaskItem]) -> list[Example]:
    """Tokenize items with the engine's boundaries (see the module docstring).

    The text is `format_training_text`'s: chat prompt, then `<think>\\n{cot}\\n</think>
    \\n\\n{answer}`, then EOS. Whatever of the target the prompt builder already opened
    (the start marker, for prompted-thinking models) belongs to the prompt; the close
    marker is `fmt.close_ids` verbatim. Texts are encoded in batches (the tokenizer
    parallelises them), which matters for thousands of 1-3k-token traces.
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no EOS token: the thinker must learn where to stop")
    parts = [_split_target(tokenizer, fmt, item) for item in items]
    raw_flags = {raw for _, raw, _, _ in parts}
    if len(raw_flags) > 1:
        raise ValueError("mixed chat-templated and raw prompts in one batch")
    prompts = _batch_encode(tokenizer, [p[0] for p in parts], add_special_tokens=raw_flags.pop() if raw_flags else False)
    heads = _batch_encode(tokenizer, [p[2] for p in parts])
    answers = _batch_encode(tokenizer, [p[3] for p in parts])
    close, eos = list(fmt.close_ids), int(tokenizer.eos_token_id)
    return [
        Example(tuple(prompt + head + close + answer + [eos]), len(prompt), item.family, cot_len=len(head))
        for item, prompt, head, answer in zip(items, prompts, heads, answers)
    ]


def early_answer_examples(
    examples: Sequence[Example],
    close_len: int,
    share: float,
    seed: int,
    fractions: tuple[float, float] = (0.1, 0.9),
) -> list[Example]:
    """Extra examples whose thinking is cut early and closed, followed by the full answer.

    Why: SSR's draft is the model's answer after its CoT was cut at the draft budget and
    closed. A thinker trained only on whole CoTs has never seen that state, and its drafts
    run on or loop (v2 at 0-25% of the CoT: 28-46 of 80 drafts hit the draft cap). Reasoning
    models that serve people are trained for it (a thinking budget that closes the CoT and
    asks for the answer now); these examples teach the same. The loss covers only the
    answer and EOS, never the cut CoT or its close marker, so the model does not learn to
    close its thinking early: what it learns is what to answer once thinking was closed.

    `share` of the examples (a seeded choice, at least 8 CoT tokens) get one copy cut at a
    uniform fraction of their CoT in `fractions`.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"early-answer share must lie in [0, 1], got {share}")
    low, high = fractions
    if not 0.0 <= low <= high < 1.0:
        raise ValueError(f"early-answer fractions must satisfy 0 <= low <= high < 1, got {fractions}")
    rng = random.Random(f"early-answer:{seed}")
    eligible = [i for i, e in enumerate(examples) if e.cot_len >= 8]
    chosen = sorted(rng.sample(eligible, round(share * len(eligible)))) if share > 0 else []
    out = []
    for i in chosen:
        e = examples[i]
        cut = max(1, min(e.cot_len - 1, round(rng.uniform(low, high) * e.cot_len)))
        head_end = e.prompt_len + e.cot_len
        ids = e.input_ids[: e.prompt_len + cut] + e.input_ids[head_end:]
        out.append(Example(ids, e.prompt_len, e.family, cot_len=cut, loss_start=e.prompt_len + cut + close_len))
    return out


def encode_example(tokenizer: Any, fmt: ThinkingFormat, item: TaskItem) -> Example:
    """One item's `Example` (see `encode_items`)."""
    return encode_items(tokenizer, fmt, [item])[0]


def encode_examples(
    tokenizer: Any, fmt: ThinkingFormat, items: Sequence[TaskItem], max_len: int
) -> tuple[list[Example], dict[str, int]]:
    """Tokenize items, dropping those longer than `max_len`; also count the drops per family."""
    kept: list[Example] = []
    dropped: dict[str, int] = {}
    for example in encode_items(tokenizer, fmt, items):
        if len(example) > max_len:
            dropped[example.family] = dropped.get(example.family, 0) + 1
            continue
        kept.append(example)
    return kept, dropped


def plan_batches(lengths: Sequence[int], tokens_per_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Group example indices into batches of similar length, at most `tokens_per_batch`
    padded tokens each, in a seeded order that changes per epoch.

    Length grouping keeps padding small; the per-epoch shuffle (of batches, and of
    examples within equal lengths) keeps training from seeing lengths in order.
    """
    rng = random.Random(f"thinker-batches|{seed}|{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: ties stay shuffled
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        width = lengths[index]  # ascending, so the newest example is the widest
        if current and (len(current) + 1) * width > tokens_per_batch:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and next-token labels (IGNORE_INDEX outside the target)."""
    width = max(len(e) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(examples):
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        # Position t predicts token t + 1: the labels are the ids shifted left by one.
        labels[row, example.target_start - 1 : len(ids) - 1] = ids[example.target_start :]
    return input_ids, labels


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class LoraSpec:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"


def add_lora(model: Any, spec: LoraSpec) -> Any:
    """Wrap `model` in a peft LoRA model (the tied output head is left alone)."""
    from peft import LoraConfig, get_peft_model

    targets = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _decoder_and_head(model: Any) -> tuple[Any, Any, float | None]:
    """The transformer body, the output projection and the logit soft-cap, if any."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else inner.model
    head = inner.get_output_embeddings()
    config = inner.config.get_text_config() if hasattr(inner.config, "get_text_config") else inner.config
    return decoder, head, getattr(config, "final_logit_softcapping", None)


def target_loss(model: Any, input_ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over target positions, and their count.

    Right padding + causal attention: real tokens never see the padding, so no mask is
    passed (SDPA then takes its causal fast path). The vocabulary projection runs on
    target rows only, in float32.
    """
    decoder, head, softcap = _decoder_and_head(model)
    hidden = decoder(input_ids=input_ids, use_cache=False).last_hidden_state
    picked = labels != IGNORE_INDEX
    logits = head(hidden[picked]).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
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


def lr_at(step: int, total_steps: int, warmup_steps: int, peak: float, floor_ratio: float) -> float:
    """Linear warm-up to `peak`, then cosine decay to `floor_ratio * peak` at `total_steps`."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak * (floor_ratio + (1 - floor_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# --------------------------------------------------------------------------- training


BUDGET_SHARE_FOR_STEPS = 0.9
"""Share of the time left after data building that the fitted steps may use: the rest
covers the held-out losses and saving, which the calibration does not time."""
HARD_STOP_FACTOR = 1.15
"""A run still going at this multiple of its time budget stops (and says so)."""


def calibrate_throughput(model: Any, examples: Sequence[Example], pad_id: int, device: torch.device, autocast: Any) -> float:
    """Padded tokens per second of forward + backward on one real batch (no update).

    Timed on the second of two passes, so one-time costs (kernel selection, allocator
    growth) do not count; gradients are dropped afterwards, so training is unchanged.
    """
    input_ids, labels = collate(examples, pad_id)
    input_ids, labels = input_ids.to(device), labels.to(device)
    model.train()
    seconds = 0.0
    for attempt in range(2):
        _synchronize(device)
        begun = time.perf_counter()
        with autocast():
            loss, _ = target_loss(model, input_ids, labels)
        loss.backward()
        _synchronize(device)
        seconds = time.perf_counter() - begun
    model.zero_grad(set_to_none=True)
    return input_ids.numel() / max(seconds, 1e-9)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fit_steps(padded_per_step: Sequence[int], tokens_per_s: float, seconds: float) -> int:
    """The most leading steps whose padded tokens take at most `seconds` (at least one).

    Fitting the step count before training, rather than stopping when time runs out,
    lets the learning-rate schedule end where the run ends; the count is recorded, so
    `--max-steps` reproduces the run without a budget.
    """
    allowed = tokens_per_s * max(seconds, 0.0)
    total, steps = 0, 0
    for tokens in padded_per_step:
        if total + tokens > allowed:
            break
        total += tokens
        steps += 1
    return max(1, steps)




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
    time_budget_s: float | None = None  # fit the step count to this budget (see `fit_steps`)
    log_every: int = 10
    # Share of training examples that also appear with the CoT cut and closed, loss on the
    # answer only (`early_answer_examples`): drafts from a partial CoT, as SSR makes them.
    early_answer_share: float = 0.0

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["data"] = self.data.describe()
        data["lora"] = asdict(self.lora)
        return data


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


def _autocast_factory(device: torch.device, dtype: torch.dtype) -> Callable[[], Any]:
    if dtype == torch.float32:
        return lambda: torch.autocast(device_type=device.type, enabled=False)
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


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
    from selfspec.models.loader import load_model, parse_dtype, resolve_device

    started = time.perf_counter()
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
    heldout_spec = DataSpec(
        config.data.families, config.heldout_seed, config.heldout_items_per_family, config.data.knobs
    )
    heldout, _ = encode_examples(tokenizer, fmt, heldout_spec.items(), config.max_len)
    data_seconds = time.perf_counter() - started
    if not examples:
        raise ValueError(f"no training example fits max_len={config.max_len}")
    log(
        f"data {config.data.version}: {len(examples)} examples ({len(early)} of them early-answer) "
        f"({sum(dropped.values())} over {config.max_len} tokens dropped: {dropped or 'none'}), "
        f"{sum(len(e) for e in examples)} tokens, built in {data_seconds:.1f}s"
    )

    torch.manual_seed(config.seed)  # LoRA init draws from the global generator
    model.requires_grad_(False)
    peft_model = add_lora(model, config.lora)
    for parameter in peft_model.parameters():
        if parameter.requires_grad:
            parameter.data = parameter.data.float()
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    log(f"LoRA r={config.lora.r} alpha={config.lora.alpha}: {sum(p.numel() for p in trainable)} trainable parameters")
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    autocast = _autocast_factory(device, dtype)

    lengths = [len(e) for e in examples]
    whole_epochs = math.ceil(config.epochs)
    schedule = [plan_batches(lengths, config.tokens_per_batch, config.seed, epoch) for epoch in range(whole_epochs)]
    steps_per_epoch = len(schedule[0])
    flat = [batch for epoch in schedule for batch in epoch][: max(1, round(config.epochs * steps_per_epoch))]
    padded_per_step = [len(batch) * max(lengths[i] for i in batch) for batch in flat]
    epochs_plan = len(flat)
    planned = epochs_plan if config.max_steps is None else min(epochs_plan, config.max_steps)
    if config.time_budget_s is not None:
        budget_left = config.time_budget_s - (time.perf_counter() - started)
        widest = max(range(len(flat)), key=lambda k: max(lengths[i] for i in flat[k]))  # attention grows with length
        tokens_per_s = calibrate_throughput(peft_model, [examples[i] for i in flat[widest]], pad_id, device, autocast)
        fitted = fit_steps(padded_per_step[:planned], tokens_per_s, budget_left * BUDGET_SHARE_FOR_STEPS)
        log(
            f"calibration: {tokens_per_s:.0f} padded tokens/s; {fitted} of {planned} steps fit "
            f"{budget_left:.0f}s left of the {config.time_budget_s:.0f}s budget (--max-steps {fitted} reproduces this run)"
        )
        planned = fitted
    flat = flat[:planned]
    warmup = round(config.warmup_ratio * planned)

    heldout_before = mean_loss(peft_model, heldout, pad_id, config.tokens_per_batch, autocast)
    log(f"held-out loss before training: {heldout_before:.4f} ({len(heldout)} examples)")
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=planned, desc="train", unit="step")
    peft_model.train()
    loss_log: list[dict[str, float]] = []
    target_tokens = padded_tokens = 0
    window_loss = window_count = 0.0
    train_started = time.perf_counter()
    stopped_early = False
    steps_done = 0
    for step, batch in enumerate(flat):
        # Never before the first step: the calibration plans at least one, and stopping before it
        # would save an untrained adapter (a loaded machine can spend the budget on data and calibration).
        if step > 0 and config.time_budget_s is not None and time.perf_counter() - started > HARD_STOP_FACTOR * config.time_budget_s:
            stopped_early = True
            log(f"{HARD_STOP_FACTOR} x the time budget passed: stopping after {step} of {planned} steps")
            break
        lr = lr_at(step, planned, warmup, config.lr, config.min_lr_ratio)
        for group in optimizer.param_groups:
            group["lr"] = lr
        input_ids, labels = collate([examples[i] for i in batch], pad_id)
        with autocast():
            loss, count = target_loss(peft_model, input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_done = step + 1
        target_tokens += count
        padded_tokens += input_ids.numel()
        window_loss += float(loss.detach()) * count  # one host sync per step: the loss log
        window_count += count
        if bar is not None:
            bar.update(1)
        if steps_done % config.log_every == 0 or steps_done == planned:
            elapsed = time.perf_counter() - train_started
            entry = {
                "step": steps_done,
                "loss": window_loss / window_count,
                "lr": lr,
                "seconds": round(elapsed, 2),
                "tokens_per_s": round(padded_tokens / max(elapsed, 1e-9)),
            }
            loss_log.append(entry)
            window_loss = window_count = 0.0
            message = f"step {steps_done}/{planned} loss {entry['loss']:.4f} lr {lr:.2e} {entry['tokens_per_s']} tok/s"
            if bar is not None:
                bar.write(message)
            else:
                log(message)
    if bar is not None:
        bar.close()
    heldout_after = mean_loss(peft_model, heldout, pad_id, config.tokens_per_batch, autocast)
    log(f"held-out loss after training: {heldout_after:.4f}")
    seconds = time.perf_counter() - started
    result = TrainResult(
        steps=steps_done,
        planned_steps=planned,
        epochs_plan_steps=epochs_plan,
        epochs_done=steps_done / steps_per_epoch,
        examples=len(examples),
        dropped=dropped,
        target_tokens=target_tokens,
        padded_tokens=padded_tokens,
        seconds=round(seconds, 2),
        data_seconds=round(data_seconds, 2),
        loss_log=loss_log,
        heldout_loss_before=heldout_before,
        heldout_loss_after=heldout_after,
        stopped_early=stopped_early,
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
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from selfspec.models.loader import parse_dtype

    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    save_dtype = parse_dtype(config.save_dtype)
    state = get_peft_model_state_dict(peft_model)
    state = {name: tensor.detach().to("cpu", save_dtype).contiguous() for name, tensor in state.items()}
    weights = target / "adapter_model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors writes 0600; the adapter ships in a package
    peft_model.peft_config["default"].save_pretrained(str(target))
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
        "training": {
            key: value for key, value in result.describe().items() if key != "loss_log"
        },
    }
    (target / ADAPTER_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (target / "loss_log.json").write_text(json.dumps(result.loss_log, indent=1) + "\n")
    return target


def adapter_size_bytes(adapter_dir: str | Path) -> int:
    return sum(f.stat().st_size for f in Path(adapter_dir).iterdir() if f.is_file())


__all__ = [
    "ADAPTER_MANIFEST",
    "DATA_VERSION",
    "DATA_VERSIONS",
    "DATA_VERSION_V2",
    "DATA_VERSION_V3",
    "DEFAULT_TASK_KNOBS",
    "V2_TASK_KNOBS",
    "V3_TASK_KNOBS",
    "DataSpec",
    "Example",
    "LoraSpec",
    "TrainConfig",
    "TrainResult",
    "adapter_size_bytes",
    "collate",
    "data_version_knobs",
    "encode_example",
    "encode_examples",
    "encode_items",
    "lr_at",
    "plan_batches",
    "save_adapter",
    "target_loss",
    "train_thinker",
]
