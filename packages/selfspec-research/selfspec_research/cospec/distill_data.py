"""The data the shallow draft is distilled on: the thinker's task traces, packed into blocks.

The traces are the thinker's (`thinker.examples`: `DataSpec` + `encode_items`), so prompt,
`<think>` CoT, the format's `close_ids` and the answer are tokenized exactly as the
thinker was trained and as the engine prompts. Training examples are packed into
`seq_len`-token blocks: every step then has the same shape (no padding, a time budget
that calibrates once), and the loss covers the positions that predict an assistant
token. Each block also carries the reference next tokens (the generated CoT + answer the
thinker itself was trained on), so a draft can learn the tasks rather than the target.
Held-out examples stay unpacked, each from its own start, as at inference.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from selfspec.thinking.format import ThinkingFormat
from selfspec_research.thinker.examples import Example, encode_items

if TYPE_CHECKING:  # annotations only: draft_distill imports this module
    from selfspec_research.cospec.draft_distill import DistillConfig


@dataclass(frozen=True)
class Blocks:
    """Packed training data: `ids` [n, seq_len]; `mask` [n, seq_len] marks positions whose
    next token is an assistant token of the same example; `targets` [n, seq_len] is that
    next token (the reference label), also across a block's end, where it lies in the next
    block."""

    ids: torch.Tensor
    mask: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def pack_examples(examples: Sequence[Example], seq_len: int) -> Blocks:
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
    # The stream ends with an EOS that predicts nothing, so a missing last target is never read.
    following = ids[1 : used + 1] + [0] * (used + 1 - len(ids))
    return Blocks(
        torch.tensor(ids[:used], dtype=torch.long).view(count, seq_len),
        torch.tensor(predicts[:used], dtype=torch.bool).view(count, seq_len),
        torch.tensor(following, dtype=torch.long).view(count, seq_len),
    )


def build_training_blocks(
    config: DistillConfig, tokenizer: Any, fmt: ThinkingFormat, needed_blocks: int
) -> tuple[Blocks, dict[str, Any]]:
    """Generate thinker items of `config.data_seed` until they pack into `needed_blocks`
    blocks (or `max_items_per_family` is reached). Items are a pure function of (family,
    seed, index), so the same config regenerates the same blocks."""
    families = config.data_spec().families
    needed_tokens = needed_blocks * config.seq_len
    examples: list[Example] = []
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


def heldout_examples(config: DistillConfig, tokenizer: Any, fmt: ThinkingFormat) -> list[Example]:
    """Held-out examples (stream `heldout_seed`), each cut to `heldout_max_len` tokens;
    examples whose prompt alone fills that are skipped."""
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


__all__ = ["Blocks", "build_training_blocks", "heldout_examples", "pack_examples", "plan_blocks"]
