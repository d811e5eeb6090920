"""Token-length statistics of a data version's items: prompt, CoT, answer and the whole
training example, per family.

    python -m selfspec_research.thinker.lengths --data-version thinker-data-v2 --items-per-family 100

Lengths are measured with SmolLM2's own tokenizer when its converted copy is in the
model cache (only `tokenizer.json` is read: no weights are loaded), else with the tiny
test tokenizer (a byte-level BPE of ~420 tokens), whose counts run about 1.5-3x larger;
the output says which tokenizer counted. The whole example is `examples.encode_items`' layout (chat prompt, CoT,
close marker, answer, EOS), i.e. what `--max-len` compares against; `ans/cot%` is the answer's
length in percent of the CoT's, item by item (its median is the answer phase's typical weight).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from selfspec.models.loader import converted_dir, resolve_cache_dir
from selfspec.models.registry import get_model_entry
from selfspec.thinking.format import ThinkingFormat
from selfspec_research.thinker.data_versions import DATA_VERSION
from selfspec_research.thinker.examples import DataSpec, encode_items
from selfspec_research.thinker.tasks import TaskItem
from selfspec_research.thinker.tasks import families as all_families


def smollm2_tokenizer() -> Any | None:
    """SmolLM2's tokenizer from the converted model cache, or None when it is not there.

    Resolves the packaged `smollm2` entry the way `selfspec.models.load_model` does but
    never converts or loads weights, so it takes a couple of seconds.
    """
    try:
        from transformers import AutoTokenizer

        entry = get_model_entry("smollm2")
        if entry is None or entry.gguf is None or entry.gguf.missing_distributions():
            return None
        directory = converted_dir(resolve_cache_dir(), entry.name, entry.gguf.fingerprint())
        if not (directory / "tokenizer.json").is_file():
            return None
        return AutoTokenizer.from_pretrained(str(directory))
    except Exception:  # noqa: BLE001 - any failure means "not available here"
        return None


def _summary(values: Sequence[int]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "min": ordered[0],
        "median": statistics.median(ordered),
        "mean": round(statistics.fmean(ordered), 1),
        "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "max": ordered[-1],
    }


def length_stats(tokenizer: Any, items: Sequence[TaskItem]) -> dict[str, dict[str, dict[str, float]]]:
    """family -> part (prompt, cot, answer, example) -> min/median/mean/p90/max tokens; part
    `ans/cot%` is each item's answer length in percent of its CoT's (the answer phase's weight)."""
    fmt = ThinkingFormat.detect(tokenizer, kind="prompted")
    examples = encode_items(tokenizer, fmt, items)
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    texts = {part: [getattr(item, part) for item in items] for part in ("prompt", "cot", "answer")}
    encoded = {part: tokenizer(values, add_special_tokens=False)["input_ids"] for part, values in texts.items()}
    for k, (item, example) in enumerate(zip(items, examples)):
        for part in ("prompt", "cot", "answer"):
            counts[item.family][part].append(len(encoded[part][k]))
        counts[item.family]["example"].append(len(example))
        answer, cot = len(encoded["answer"][k]), len(encoded["cot"][k])
        counts[item.family]["ans/cot%"].append(round(100 * answer / max(cot, 1)))
    return {family: {part: _summary(values) for part, values in parts.items()} for family, parts in counts.items()}


def format_stats(stats: dict[str, dict[str, dict[str, float]]], tokenizer_name: str, n: int) -> str:
    lines = [f"tokens ({tokenizer_name}), {n} items per family: min / median / mean / p90 / max"]
    for family, parts in stats.items():
        lines.append(f"{family}:")
        for part, s in parts.items():
            lines.append(
                f"  {part:8s} {s['min']:>5} / {s['median']:>7} / {s['mean']:>7} / {s['p90']:>5} / {s['max']:>5}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-version", default=DATA_VERSION)
    parser.add_argument("--families", default=",".join(all_families()))
    parser.add_argument("--items-per-family", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spec = DataSpec.for_version(
        args.data_version,
        families=tuple(args.families.split(",")),
        seed=args.seed,
        items_per_family=args.items_per_family,
    )
    tokenizer, name = smollm2_tokenizer(), "SmolLM2"
    if tokenizer is None:
        from selfspec.testing.tiny import tiny_tokenizer  # slow to import (every model class): the fallback only

        tokenizer, name = tiny_tokenizer(), "tiny test tokenizer: SmolLM2 is not cached; counts run about 1.5-3x larger"
    print(f"{spec.version}, seed {spec.seed}")
    print(format_stats(length_stats(tokenizer, spec.items()), name, args.items_per_family))


if __name__ == "__main__":
    main()
