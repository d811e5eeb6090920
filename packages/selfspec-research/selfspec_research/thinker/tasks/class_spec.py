"""The shapes the class-synthesis family composes specs from (the table is in
`class_concepts.py`).

A `ClassConcept` is a small stateful class (an account, an inventory, a playlist …)
with a constructor and a pool of independent methods. Each method carries the words
that specify it, its reference body, and *probes*: random call sequences whose results
become unit tests and prompt examples. Methods touch only the attributes the
constructor spec names, never each other, so any subset of a pool is a valid class;
that subset choice (plus class/attribute name variants) is where item variety comes
from.

Placeholders use `string.Template` syntax (`$o` the test's object variable, `$cls` the
class name, and per-concept attribute names such as `$bal`), because Python code is
full of the braces that `str.format` would trip on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import vocab


class Draw:
    """Random values for probes, drawn from one item's RNG so tests reproduce."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[Any]) -> Any:
        return self.rng.choice(options)

    def sample(self, options: Sequence[Any], k: int) -> list[Any]:
        return self.rng.sample(list(options), k)

    def price(self, low: int = 100, high: int = 9000) -> float:
        """A price with two decimals, from cents."""
        return self.rng.randint(low, high) / 100

    def first(self) -> str:
        return self.rng.choice(vocab.FIRST_NAMES)

    def people(self, k: int) -> list[str]:
        return self.sample(vocab.FIRST_NAMES, k)

    def words(self, k: int) -> list[str]:
        return self.sample(vocab.WORDS, k)

    def sentence(self) -> str:
        words = [self.pick(vocab.ARTICLES), self.pick(vocab.WORDS), self.pick(vocab.VERBS)]
        words += [self.pick(vocab.ARTICLES), self.pick(vocab.WORDS)]
        if self.rng.random() < 0.5:
            words += ["and", self.pick(vocab.WORDS)]
        words[0] = words[0].capitalize()
        return " ".join(words) + self.pick(".!?.")

    def text(self, sentences: int | None = None) -> str:
        count = sentences if sentences is not None else self.int(2, 4)
        return " ".join(self.sentence() for _ in range(count))

    def date(self, year: int | None = None, month: int | None = None) -> str:
        y = year if year is not None else self.int(2023, 2025)
        m = month if month is not None else self.int(1, 12)
        return f"{y:04d}-{m:02d}-{self.int(1, 28):02d}"


@dataclass(frozen=True)
class Probe:
    """A call sequence: after construction (and the concept's fill unless `fill=False`),
    run `setup`, then evaluate `expr`; `raises` names the exception the spec demands."""

    expr: str
    setup: tuple[str, ...] = ()
    fill: bool = True
    ctor: str | None = None
    raises: str | None = None


def P(expr: str, *setup: str, fill: bool = True, ctor: str | None = None, raises: str | None = None) -> Probe:
    """Short constructor for probes, so concept tables stay readable."""
    return Probe(expr, tuple(setup), fill, ctor, raises)


ProbeFn = Callable[[Draw, Mapping[str, Any]], Probe]
FillFn = Callable[[Draw], tuple[list[str], dict[str, Any]]]


@dataclass(frozen=True)
class MethodSpec:
    """One method: signature (without `self`), the words that specify it, its body."""

    name: str
    params: str
    doc: str
    body: str
    probes: tuple[ProbeFn, ...] = ()
    summary: str = ""


def _no_fill(d: Draw) -> tuple[list[str], dict[str, Any]]:
    """Concepts whose state comes from the constructor alone need no fill."""
    return [], {}


@dataclass(frozen=True)
class ClassConcept:
    key: str
    class_names: tuple[str, ...]
    var: str
    summary: str
    init: MethodSpec
    ctor_args: Callable[[Draw], str]
    methods: tuple[MethodSpec, ...]
    attrs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    fill: FillFn = _no_fill
    imports: tuple[str, ...] = ()
