"""Small helpers for CoTs whose wording varies from item to item (the thinker-data-v4 versions).

Why: a CoT written from one fixed template restates its prompt and repeats the same
sentences in every item, which flatters copy-based speculation (prompt lookup, suffix
decoding): it proposes whole template sentences it has seen before. The reworded versions
pick each step's phrasing, and the order of steps that do not depend on each other, with
the item's own random stream, so every choice is reproducible from (seed, index) alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def pick(rng: random.Random, options: Sequence[str], **fields: Any) -> str:
    """One of `options`, chosen with `rng`, with `fields` filled in (`str.format`)."""
    return rng.choice(options).format(**fields)


def shuffled(rng: random.Random, values: Sequence[T]) -> list[T]:
    """A shuffled copy of `values` (the order of independent facts or checks)."""
    out = list(values)
    rng.shuffle(out)
    return out


def spoken_list(rng: random.Random, names: Sequence[str], last: str = "and") -> str:
    """`names` as one phrase, joined one of a few natural ways ("a, b and c", "a, b, c",
    "a, b, and c"); two names are always "a and b" (`last` instead of "and" if given)."""
    names = list(names)
    if len(names) <= 1:
        return "".join(names)
    style = 0 if len(names) == 2 else rng.randrange(3)
    if style == 1:
        return ", ".join(names)
    return ", ".join(names[:-1]) + ("," if style == 2 else "") + f" {last} " + names[-1]


def capitalised(text: str) -> str:
    """`text` with its first character upper-cased (a phrase that opens a sentence)."""
    return text[:1].upper() + text[1:]


def plural(count: int, word: str, many: str | None = None) -> str:
    """ "1 hop", "3 hops"; `many` for irregular plurals."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def ordinal(k: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
