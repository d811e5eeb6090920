"""Engine runs of the arbitrator's training: many requests at once, cut at a deadline."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from selfspec import SamplingParams
from selfspec_research.cospec.eval_tasks import EvalItem


@dataclass
class Request:
    """One generation the engine runs: prompt (messages or token ids), sampling, method."""

    prompt: Any
    params: SamplingParams
    spec: Any = None
    thinking: bool | None = None


def run_requests(llm, requests: Sequence[Request], deadline: float | None = None, bar=None) -> list[Any]:
    """Submit all, step the engine until done; at `deadline` cancel what still runs.

    Returns the engine sequences (read results with `llm.result`; a cancelled one has
    finish reason "cancelled").
    """
    seqs = [llm.submit(r.prompt, r.params, spec=r.spec, thinking=r.thinking) for r in requests]
    done = 0
    while not all(s.is_finished for s in seqs):
        if deadline is not None and time.monotonic() >= deadline:
            for s in seqs:
                if not s.is_finished:
                    llm.engine.cancel(s, "time budget")
            break
        llm.engine.step()
        if bar is not None:
            now = sum(s.is_finished for s in seqs)
            bar.update(now - done)
            done = now
    return seqs


def is_cancelled(seq) -> bool:
    """Whether `run_requests` cut this sequence at its deadline."""
    reason = getattr(seq.finish_reason, "value", seq.finish_reason)
    return reason == "cancelled"


def fits(llm, item: EvalItem, thinking: bool | None, margin: int = 32) -> bool:
    """Whether `item`'s prompt leaves at least `margin` tokens of the engine's context."""
    try:
        return (
            len(llm.encode_prompt(item.messages, thinking=llm._thinking_enabled(thinking))) + margin
            < llm.engine.max_len
        )
    except ValueError:
        return False


__all__ = ["Request", "fits", "is_cancelled", "run_requests"]
