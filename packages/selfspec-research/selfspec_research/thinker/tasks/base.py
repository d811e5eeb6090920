"""What every thinker task family shares: the item, the check result, the family contract.

A *task item* is one synthetic think→answer trace: a prompt, a chain of thought (CoT)
that works the answer out piece by piece, and the final answer. The testbed trains a
small model on these traces and then measures how much of the final answer a draft
forked from a partial CoT already holds, so two properties matter more than anything:

* **Reproducibility.** An item is a pure function of (family, version, seed, index)
  and the family's knobs. The random generator is seeded from a SHA-256 of those
  values, never from Python's salted `hash()`, so a split regenerates bit-for-bit in
  another process or on another machine.
* **Pieces in order.** The CoT writes the answer's pieces (methods, rows, hops,
  equations) in the same order and format as the answer, surrounded by notes.
  `ordered_line_coverage` measures it.

Checkers read only the item (its `meta` holds what they need: tests, graph, numbers),
so items stored as JSONL can be checked without regenerating them.
"""

from __future__ import annotations

import hashlib
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

THINK_START = "<think>"
THINK_END = "</think>"
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class TaskItem:
    """One think→answer trace.

    `meta` is JSON-serialisable data the checker needs (unit tests, the graph, the
    puzzles) and the knobs it was generated with; it is never shown to the model.
    """

    family: str
    version: int
    seed: int
    index: int
    prompt: str
    cot: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict, compare=True)

    @property
    def uid(self) -> str:
        """A stable name for the item, usable as a file or record key."""
        return f"{self.family}-v{self.version}-s{self.seed}-i{self.index}"

    def to_dict(self) -> dict[str, Any]:
        """A plain dict for JSON(L) storage; `from_dict` inverts it."""
        data = asdict(self)
        data["meta"] = dict(self.meta)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TaskItem":
        return cls(
            family=str(data["family"]),
            version=int(data["version"]),
            seed=int(data["seed"]),
            index=int(data["index"]),
            prompt=str(data["prompt"]),
            cot=str(data["cot"]),
            answer=str(data["answer"]),
            meta=dict(data.get("meta", {})),
        )


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one answer: `passed` is all-or-nothing, `score` is partial credit."""

    passed: bool
    score: float
    detail: str = ""


def stable_rng(*parts: object) -> random.Random:
    """A `random.Random` seeded from a SHA-256 of `parts`.

    Python's `hash()` of a string changes per process (PYTHONHASHSEED), which would
    make "the same split" differ between the trainer and the evaluator.
    """
    key = "\x1f".join(str(part) for part in parts).encode("utf-8")
    digest = hashlib.sha256(key).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def estimate_tokens(text: str) -> int:
    """Rough token count (4 characters a token): the unit the length knobs are tuned in."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def final_answer_text(text: str) -> str:
    """The answer part of a model output: what follows the last `</think>`, if any.

    Checkers accept either a bare answer or a full output with its thinking block, so
    the eval can pass whatever the model produced.
    """
    if THINK_END in text:
        text = text.rsplit(THINK_END, 1)[1]
    return text.strip("\n")


def _significant_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def ordered_line_coverage(answer: str, cot: str) -> float:
    """Fraction of the answer's non-blank lines that the CoT contains, in order.

    Lines are compared stripped of surrounding whitespace; the count is the longest
    common subsequence of the two line lists, so a line the CoT writes twice (or a
    note that happens to equal an answer line) never inflates the ratio. This is the
    property the testbed relies on: a draft forked after k pieces of the CoT can
    copy those k pieces.
    """
    answer_lines = _significant_lines(answer)
    if not answer_lines:
        return 1.0
    cot_lines = _significant_lines(cot)
    wanted = set(answer_lines)
    cot_lines = [line for line in cot_lines if line in wanted]
    previous = [0] * (len(cot_lines) + 1)
    for answer_line in answer_lines:
        current = [0] * (len(cot_lines) + 1)
        for j, cot_line in enumerate(cot_lines, start=1):
            if answer_line == cot_line:
                current[j] = previous[j - 1] + 1
            else:
                current[j] = max(previous[j], current[j - 1])
        previous = current
    return previous[-1] / len(answer_lines)


def format_training_text(item: TaskItem) -> tuple[list[dict[str, str]], str]:
    """Chat messages (the user turn) and the assistant target for supervised training.

    The target puts the CoT inside `<think>` … `</think>` and the answer after it, the
    layout `selfspec.thinking.format` expects from a prompted-thinking model.
    """
    messages = [{"role": "user", "content": item.prompt}]
    target = f"{THINK_START}\n{item.cot}\n{THINK_END}\n\n{item.answer}"
    return messages, target


class TaskFamily(ABC):
    """A seeded generator of one kind of task, plus its checker.

    Subclasses set `name` and `version` (bump the version whenever a change alters
    generated items, so stored splits stay interpretable) and implement `build`, the
    item's content from a seeded RNG. Difficulty knobs are constructor arguments; the
    ones an item was built with are recorded in its `meta["knobs"]`.
    """

    name: str = ""
    version: int = 1
    stream_version: int | None = None
    """The version whose random stream an item is drawn from (None: this version's own).

    A version that only rewords an earlier version's CoT names that version here and draws
    its wording from the stream only once the prompt and answer are drawn, so the same
    (seed, index) gives both versions the same prompt, answer and checker data."""

    def knobs(self) -> dict[str, Any]:
        """The difficulty knobs of this instance (recorded in every item's meta)."""
        return {}

    def generate(self, seed: int, index: int) -> TaskItem:
        """The item at `index` of the stream `seed`: the same on every call and process."""
        stream = self.version if self.stream_version is None else self.stream_version
        rng = stable_rng(self.name, stream, seed, index, sorted(self.knobs().items()))
        prompt, cot, answer, meta = self.build(rng)
        meta = {**meta, "knobs": self.knobs()}
        return TaskItem(self.name, self.version, seed, index, prompt, cot, answer, meta)

    @abstractmethod
    def build(self, rng: random.Random) -> tuple[str, str, str, dict[str, Any]]:
        """Return (prompt, cot, answer, meta) drawn from `rng`."""

    @abstractmethod
    def check(self, item: TaskItem, answer_text: str) -> CheckResult:
        """Judge `answer_text` (a bare answer or a full output with thinking) for `item`."""

    def check_many(self, items: Sequence[TaskItem], answers: Sequence[str]) -> list[CheckResult]:
        """Judge many answers; families whose check is costly (subprocesses) batch here."""
        if len(items) != len(answers):
            raise ValueError(f"{len(items)} items but {len(answers)} answers")
        return [self.check(item, answer) for item, answer in zip(items, answers)]


def require_range(name: str, low: int, high: int, floor: int = 1) -> None:
    """Validate a (low, high) knob pair early, with a message that names the knob."""
    if not floor <= low <= high:
        raise ValueError(f"{name}: need {floor} <= min <= max, got ({low}, {high})")
