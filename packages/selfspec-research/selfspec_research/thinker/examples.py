"""The thinker's training data: which items, how they become token sequences, and batches.

Three choices shape this module:

* **Data is a generator plus a seed, never files.** `DataSpec` names the families,
  their difficulty knobs (a data version of `data_versions` pins them), the seed and the
  count; any machine regenerates the same examples bit for bit, so a GPU run carries no
  data and the held-out split is just another seed.
* **The token boundaries are the engine's.** The prompt is tokenized exactly as
  `build_prompt_ids` tokenizes it at inference (chat template, then the opening
  marker for prompted-thinking models), and the CoT is closed with the format's
  `close_ids`: the tokens the engine appends when it closes thinking by force or
  forks an SSR draft. A draft therefore sees the very boundary the model learned.
* **Loss on the assistant part only**, with batches grouped by length and right
  padding, so plain causal attention needs no mask (`collate` marks the targets).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from selfspec.thinking.format import ThinkingFormat, build_prompt_text
from selfspec_research.lora_training import token_budget_batches
from selfspec_research.thinker.data_versions import (
    DATA_VERSION,
    DEFAULT_TASK_KNOBS,
    TRAIN_SEED,
    data_version_knobs,
    data_version_parts,
)
from selfspec_research.thinker.tasks import TaskItem, format_training_text, generate_split
from selfspec_research.thinker.tasks import families as all_families

IGNORE_INDEX = -100
"""The label of positions outside the target (what `cross_entropy` ignores by default)."""


@dataclass(frozen=True)
class DataSpec:
    """Which items to generate: `items_per_family` items of each family from stream `seed`."""

    families: tuple[str, ...] = tuple(all_families())
    seed: int = TRAIN_SEED
    items_per_family: int = 1500
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: DEFAULT_TASK_KNOBS)
    version: str = DATA_VERSION
    also: tuple[Mapping[str, Mapping[str, Any]], ...] = ()
    """Further knob sets whose items join the split (a data mix, `data_versions.DATA_MIXES`)."""

    @classmethod
    def for_version(
        cls,
        version: str = DATA_VERSION,
        families: Sequence[str] | None = None,
        seed: int = TRAIN_SEED,
        items_per_family: int = 1500,
    ) -> "DataSpec":
        """The spec of built-in data version `version` (see `DATA_VERSIONS`, and `DATA_MIXES`)."""
        first, *rest = data_version_parts(version)
        return cls(
            families=tuple(families) if families is not None else tuple(all_families()),
            seed=seed,
            items_per_family=items_per_family,
            knobs=data_version_knobs(first),
            version=version,
            also=tuple(data_version_knobs(part) for part in rest),
        )

    def knob_sets(self) -> list[dict[str, dict[str, Any]]]:
        """`knobs`, then each of `also` without the families whose knobs came before (the same items)."""
        sets: list[dict[str, dict[str, Any]]] = []
        for knobs in (self.knobs, *self.also):
            chosen = {name: dict(knobs.get(name, {})) for name in self.families}
            sets.append({name: values for name, values in chosen.items() if all(s.get(name) != values for s in sets)})
        return sets

    def items(self, start: int = 0) -> list[TaskItem]:
        return [
            item
            for knobs in self.knob_sets()
            for item in generate_split(list(knobs), self.seed, self.items_per_family, knobs=knobs, start=start)
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "families": list(self.families),
            "seed": self.seed,
            "items_per_family": self.items_per_family,
            "knobs": {name: dict(self.knobs.get(name, {})) for name in self.families},
            **({"also": self.knob_sets()[1:]} if self.also else {}),
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
        target = target[len(opened) :]
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
    prompts = _batch_encode(
        tokenizer, [p[0] for p in parts], add_special_tokens=raw_flags.pop() if raw_flags else False
    )
    heads = _batch_encode(tokenizer, [p[2] for p in parts])
    answers = _batch_encode(tokenizer, [p[3] for p in parts])
    close, eos = list(fmt.close_ids), int(tokenizer.eos_token_id)
    return [
        Example(tuple(prompt + head + close + answer + [eos]), len(prompt), item.family, cot_len=len(head))
        for item, prompt, head, answer in zip(items, prompts, heads, answers)
    ]


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
    from an early cut tend to run on or loop until the draft cap. Reasoning models that
    serve people are trained for it (a thinking budget that closes the CoT and asks for
    the answer now); these examples teach the same. The loss covers only the answer and
    EOS, never the cut CoT or its close marker, so the model does not learn to close its
    thinking early: what it learns is what to answer once thinking was closed.

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
    batches = token_budget_batches(order, lengths, tokens_per_batch)
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


__all__ = [
    "IGNORE_INDEX",
    "DataSpec",
    "Example",
    "collate",
    "early_answer_examples",
    "encode_example",
    "encode_examples",
    "encode_items",
    "plan_batches",
]
