"""How much a chain of thought copies: from its own prompt, and from other items' CoTs.

    selfspec thinker copy-stats --data-version thinker-data-v3,thinker-data-v4 --items 50 --seed 1000
    python -m selfspec_research.thinker.copying --data-version thinker-data-v4  # without the main CLI

Copy-based speculation (prompt lookup, suffix decoding) is flattered by CoTs that restate
their prompt word for word or reuse the same template sentences in every item: it proposes
whole sentences it has seen before. Two shares say how much of a CoT such a proposer could
have copied:

* **prompt copy**: the fraction of CoT tokens inside some n-gram (n = 8 by default) that
  also occurs in the item's prompt;
* **template reuse**: the fraction inside some n-gram that also occurs in *another* item's
  CoT of the same family (the same sentence across items).

Both are also given over the CoT's *notes* alone, its lines that are not answer lines: the
answer's pieces (code, rows, hops, equations) are written in the CoT on purpose, so a draft
forked mid-CoT can agree with the final answer, and code from one concept's templates recurs
across items whatever the wording around it.

Tokens are whitespace-separated words unless a tokenizer is given (then its ids, each line
encoded on its own so every token belongs to one line). An n-gram may span lines.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from selfspec_research.thinker.tasks import TaskItem

NGRAM = 8
"""Window length: long enough that a shared window is a copied phrase, not a common idiom."""


@dataclass(frozen=True)
class Tokens:
    """A text's tokens and, for each token, whether its line is one of the answer's lines."""

    ids: tuple[Any, ...]
    in_answer: tuple[bool, ...]


def tokenize(text: str, tokenizer: Any | None = None, answer: str = "") -> Tokens:
    """`text` as tokens, each marked as part of an answer line (a line equal, stripped, to
    a non-blank line of `answer`) or not."""
    answer_lines = {line.strip() for line in answer.splitlines() if line.strip()}
    ids: list[Any] = []
    marks: list[bool] = []
    for line in text.splitlines():
        if tokenizer is None:
            pieces: Sequence[Any] = line.split()
        else:
            pieces = tokenizer.encode(line, add_special_tokens=False) if line.strip() else []
        ids.extend(pieces)
        marks.extend([line.strip() in answer_lines] * len(pieces))
    return Tokens(tuple(ids), tuple(marks))


def ngrams(ids: Sequence[Any], n: int = NGRAM) -> set[tuple[Any, ...]]:
    """The distinct n-grams of `ids` (none when it is shorter than n)."""
    return {tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)}


def covered(ids: Sequence[Any], shared: set[tuple[Any, ...]] | Counter, n: int = NGRAM) -> list[bool]:
    """Per token: does some n-gram of `ids` that contains it belong to `shared`?"""
    marks = [False] * len(ids)
    for i in range(len(ids) - n + 1):
        if tuple(ids[i : i + n]) in shared:
            for j in range(i, i + n):
                marks[j] = True
    return marks


def share(marks: Sequence[bool], among: Sequence[bool] | None = None) -> float:
    """The fraction of marked tokens, among all (or among those where `among` is true)."""
    chosen = [mark for k, mark in enumerate(marks) if among is None or among[k]]
    return sum(chosen) / len(chosen) if chosen else 0.0


def prompt_copy_share(cot: str, prompt: str, n: int = NGRAM, tokenizer: Any | None = None) -> float:
    """Fraction of `cot`'s tokens covered by n-grams that also occur in `prompt`."""
    ids = tokenize(cot, tokenizer).ids
    return share(covered(ids, ngrams(tokenize(prompt, tokenizer).ids, n), n))


def template_reuse_shares(cots: Sequence[str], n: int = NGRAM, tokenizer: Any | None = None) -> list[float]:
    """Per CoT, the fraction of its tokens covered by n-grams that occur in another of `cots`."""
    ids = [tokenize(cot, tokenizer).ids for cot in cots]
    return [share(marks) for marks in _reuse_marks(ids, n)]


def _reuse_marks(ids: Sequence[Sequence[Any]], n: int) -> list[list[bool]]:
    # An n-gram occurs in another text exactly when at least two texts hold it.
    holders = Counter(gram for text in ids for gram in ngrams(text, n))
    repeated = {gram for gram, count in holders.items() if count >= 2}
    return [covered(text, repeated, n) for text in ids]


def copy_stats(items: Iterable[TaskItem], n: int = NGRAM, tokenizer: Any | None = None) -> dict[str, dict[str, Any]]:
    """Per family: items, mean CoT tokens, the share of CoT tokens on answer lines, and the
    prompt-copy and template-reuse shares over all CoT tokens and over the notes alone, and
    the share that is either ("copyable": what a proposer holding the prompt and the other
    items' CoTs could have copied).

    Shares are pooled over the family's CoT tokens (a long CoT weighs more than a short one),
    which is what a copying proposer meets when it reads the whole split.
    """
    by_family: dict[str, list[TaskItem]] = defaultdict(list)
    for item in items:
        by_family[item.family].append(item)
    table: dict[str, dict[str, Any]] = {}
    for family, group in by_family.items():
        cots = [tokenize(item.cot, tokenizer, item.answer) for item in group]
        reuse = _reuse_marks([cot.ids for cot in cots], n)
        copied: list[bool] = []
        reused: list[bool] = []
        answer: list[bool] = []
        for item, cot, marks in zip(group, cots, reuse):
            copied += covered(cot.ids, ngrams(tokenize(item.prompt, tokenizer).ids, n), n)
            reused += marks
            answer += cot.in_answer
        notes = [not flag for flag in answer]
        either = [a or b for a, b in zip(copied, reused)]
        table[family] = {
            "items": len(group),
            "cot_tokens": round(len(answer) / len(group), 1),
            "answer_line_share": round(share(answer), 4),
            "prompt_copy": round(share(copied), 4),
            "prompt_copy_notes": round(share(copied, notes), 4),
            "template_reuse": round(share(reused), 4),
            "template_reuse_notes": round(share(reused, notes), 4),
            "copyable": round(share(either), 4),
            "copyable_notes": round(share(either, notes), 4),
        }
    return table


def format_table(rows: dict[str, dict[str, dict[str, Any]]], n: int = NGRAM, unit: str = "words") -> str:
    """A markdown table of `copy_stats` results, keyed data version -> family -> stats."""

    def pct(value: float) -> str:
        return f"{100 * value:.1f}%"

    lines = [
        f"| data version | family | items | CoT {unit} (mean) | on answer lines | prompt copy: all / notes "
        f"| template reuse: all / notes | either: all / notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for version, families in rows.items():
        for family, s in families.items():
            lines.append(
                f"| {version} | {family} | {s['items']} | {s['cot_tokens']:.0f} | {pct(s['answer_line_share'])} "
                f"| {pct(s['prompt_copy'])} / {pct(s['prompt_copy_notes'])} "
                f"| {pct(s['template_reuse'])} / {pct(s['template_reuse_notes'])} "
                f"| {pct(s['copyable'])} / {pct(s['copyable_notes'])} |"
            )
    lines.append(f"({n}-grams of {unit}; shares pooled over each family's CoT tokens.)")
    return "\n".join(lines)


def copy_stats_table(
    data_versions: Sequence[str],
    families: Sequence[str] | None = None,
    items: int = 50,
    seed: int = 1000,
    n: int = NGRAM,
    tokenizer: Any | None = None,
    unit: str = "words",
) -> str:
    """The table for built-in data versions `data_versions` (`items` items per family)."""
    from selfspec_research.thinker.examples import DataSpec  # imports torch: only the table needs it

    rows = {
        version: copy_stats(DataSpec.for_version(version, families, seed, items).items(), n, tokenizer)
        for version in data_versions
    }
    return format_table(rows, n, unit)


def named_tokenizer(name: str) -> tuple[Any | None, str]:
    """(tokenizer, unit) for `name`: "words" (whitespace-separated words, no tokenizer) or
    "smollm2" (SmolLM2's tokenizer, the thinker's, from the converted model cache)."""
    if name == "words":
        return None, "words"
    if name == "smollm2":
        from selfspec_research.thinker.lengths import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
        if tokenizer is None:
            raise ValueError("SmolLM2's tokenizer is not in the model cache (load `smollm2` once to convert it)")
        return tokenizer, "SmolLM2 tokens"
    raise ValueError(f"unknown tokenizer {name!r}: words or smollm2")


def main(argv: Sequence[str] | None = None) -> None:
    from selfspec_research.thinker.data_versions import DATA_VERSION, HELDOUT_SEED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-version", default=DATA_VERSION, help="one or more, comma-separated")
    parser.add_argument("--families", default=None, help="comma-separated (default: all)")
    parser.add_argument("--items", type=int, default=50, help="items per family")
    parser.add_argument("--seed", type=int, default=HELDOUT_SEED)
    parser.add_argument("--ngram", type=int, default=NGRAM)
    parser.add_argument("--tokenizer", default="words", choices=("words", "smollm2"))
    args = parser.parse_args(argv)
    families = args.families.split(",") if args.families else None
    versions = [version.strip() for version in args.data_version.split(",") if version.strip()]
    tokenizer, unit = named_tokenizer(args.tokenizer)
    print(copy_stats_table(versions, families, args.items, args.seed, args.ngram, tokenizer, unit))


if __name__ == "__main__":
    main()
