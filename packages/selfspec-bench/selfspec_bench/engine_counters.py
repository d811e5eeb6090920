"""Counters the bench reads off the engine around a timed run, so each record says what the run
paid for or used beside its latency."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selfspec import LLM


def compiled_graph_count() -> int:
    """Graphs torch.compile has built in this process so far.

    Why: a record whose run compiled something paid for it in its latency, and its eager forwards
    (prefill, long verify chunks, which call the engine's compiled twins) may have switched kernels
    mid-process; the warm-up is meant to leave 0 for every timed run."""
    from torch._dynamo.utils import counters  # torch._dynamo loads the compiler stack: only once a run asks

    return int(counters["stats"]["unique_graphs"])


def decode_ahead_taken(llm: LLM) -> int | None:
    """Steps so far that took a forward launched one step ahead (`engine.decode_ahead`); None where
    decoding ahead is off. Why in the records: a schedule recorder turns it off, so the plain
    baseline of a run with schedules decodes serially, and a reader must be able to tell."""
    ahead = llm.engine.runner.ahead
    return None if ahead is None or llm.engine.runner.recorder is not None else ahead.used
