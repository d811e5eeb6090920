"""The one record every benchmark loader produces and every scorer consumes.

Keeping a single shape (chat messages in, a free-form ``reference`` dict for the
scorer) lets the bench runner treat HumanEval, ClassEval, LongProc and the math sets
alike: it only sends ``messages`` to the model and hands the answer back to
:func:`selfspec_bench.scoring.score` together with the sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchSample:
    """One benchmark item.

    Attributes:
        id: stable, unique within its benchmark (e.g. ``"HumanEval/0"``).
        benchmark: registry name of the benchmark (``"humaneval"``,
            ``"longproc/countdown"``, ...); the scorer dispatches on it.
        messages: chat messages (``{"role": ..., "content": ...}``) to send.
        reference: whatever the scorer needs (tests, entry point, gold answer, ...).
    """

    id: str
    benchmark: str
    messages: list[dict[str, str]]
    reference: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        """The user turn's text; convenient for models without a chat template."""
        return "\n\n".join(m["content"] for m in self.messages if m.get("role") == "user")


def user_message(text: str) -> list[dict[str, str]]:
    """Single-turn chat: the benchmarks define a user prompt and no system prompt."""
    return [{"role": "user", "content": text}]


def apply_window(items: list, limit: int | None, offset: int) -> list:
    """Slice ``items`` to ``[offset, offset + limit)``; validates the arguments early."""
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    end = None if limit is None else offset + limit
    return items[offset:end]
