"""CUDA-graph replays of the arbitrator's one-state inference forward.

Why: CoSpec asks the arbitrator at nearly every verification round (the draft mismatches
the target about once per 2.8 tokens on the thinker tasks), one state at a time, on the
critical path. Eagerly that forward is ~460 small kernels (8 decoder layers, LoRA on four
projections each, transformers' rotary and norms), each launched from Python: on the H200
the GPU sat at ~5% while CoSpec rollouts ran, an RL iteration (12 rollouts of ≤ 1,280
tokens) did not finish in 270 s, and the eval did not finish one task in 16 minutes
(session 4, `benchmarks/results/h200/session4/`). Replaying a captured graph costs one
launch.

How: states are right-padded to a width bucket (64, 128, …): padding keys are invisible
and padding queries attend only to themselves (`build_batch`'s rule), so the real rows see
exactly what they see unpadded; only float reduction order may differ. One static set of
input buffers and one graph per bucket, captured on first use (all buckets up to the
needed one, so no capture lands in the middle of a timed run twice). The graph reads the
LoRA and head parameters in place, so RL's in-place optimizer steps are seen by later
replays. Batches of several states, training-mode forwards (dropout), CPU tensors and
widths above the largest bucket run eagerly as before.
"""

from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from selfspec.cospec.arbitrator import ArbitrationState, ArbitratorBatch, build_batch
from selfspec.engine.static_forward import capture_graph

if TYPE_CHECKING:
    from selfspec.cospec.arbitrator import Arbitrator

WIDTH_BUCKETS: tuple[int, ...] = (64, 128, 256, 384, 512, 576, 640, 768, 1024, 1536, 2048)
"""Padded state widths. The eval's states are ≤ 512 prefix + 2K + 1 (K = 8: 529 → 576)."""


@dataclass
class _Captured:
    batch: ArbitratorBatch  # static input buffers, width = bucket
    logits: torch.Tensor  # [1] static output
    graph: torch.cuda.CUDAGraph | None


class ArbitratorGraphs:
    """Per-bucket static buffers and graphs for one arbitrator (module doc)."""

    def __init__(self, arbitrator: "Arbitrator", *, capture: bool | None = None, buckets: tuple[int, ...] = WIDTH_BUCKETS) -> None:
        self._arbitrator = weakref.ref(arbitrator)
        self.device = arbitrator.head.weight.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.buckets = tuple(sorted(buckets))
        self.captured: dict[int, _Captured] = {}
        self.capture_seconds = 0.0
        self.capture_error: str | None = None
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays = 0

    def bucket(self, width: int) -> int | None:
        return next((b for b in self.buckets if b >= width), None)

    def keep_logits(self, state: ArbitrationState) -> torch.Tensor | None:
        """The keep-draft logit [1] for one state, or None when it has no bucket."""
        width = self.bucket(state.length)
        if width is None:
            return None
        entry = self.captured.get(width)
        if entry is None:
            self.prepare(width)
            entry = self.captured[width]
        padded = build_batch([state], "cpu", width=width)
        for static, value in zip(
            (entry.batch.input_ids, entry.batch.position_ids, entry.batch.allowed, entry.batch.decision_index),
            (padded.input_ids, padded.position_ids, padded.allowed, padded.decision_index),
        ):
            static.copy_(value, non_blocking=True)
        if entry.graph is not None:
            entry.graph.replay()
        else:
            self._body(entry)
        self.replays += 1
        return entry.logits.clone()

    def prepare(self, max_width: int) -> None:
        """Build (capture) every bucket a state of up to `max_width` tokens can need, now:
        the policy calls this when it is built, so no capture lands inside a timed run."""
        top = self.bucket(max_width) or self.buckets[-1]
        for b in self.buckets:
            if b <= top and b not in self.captured:
                self.captured[b] = self._build(b)

    def _build(self, width: int) -> _Captured:
        empty = ArbitrationState(prefix=(0,) * max(width - 3, 0), draft_block=(0,), target_block=(0,))
        template = build_batch([empty], self.device, width=width)
        entry = _Captured(template, torch.zeros(1, device=self.device), None)
        if not self.capture:
            return entry
        start = time.perf_counter()
        try:
            entry.graph = capture_graph(lambda: self._body(entry), self.device, self.pool)
        except Exception as exc:  # noqa: BLE001 - an eager arbitrator is slow, not wrong
            self.capture = False
            self.capture_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            warnings.warn(f"arbitrator CUDA graph capture failed, running it eagerly: {self.capture_error}")
            torch.cuda.synchronize(self.device)
        self.capture_seconds += time.perf_counter() - start
        return entry

    def _body(self, entry: _Captured) -> None:
        arbitrator = self._arbitrator()
        if arbitrator is None:
            raise RuntimeError("the arbitrator these graphs belong to is gone")
        with torch.inference_mode():
            entry.logits.copy_(arbitrator(entry.batch))

    def stats(self) -> dict:
        return {
            "graphs": sorted(b for b, e in self.captured.items() if e.graph is not None),
            "capture_s": round(self.capture_seconds, 3),
            "replays": self.replays,
            "capture_error": self.capture_error,
        }


_GRAPHS: "weakref.WeakKeyDictionary[Arbitrator, ArbitratorGraphs]" = weakref.WeakKeyDictionary()


def graphs_for(arbitrator: "Arbitrator") -> ArbitratorGraphs:
    """The arbitrator's graph set, kept beside it (not on it: `copy.deepcopy` of an
    arbitrator, e.g. RL's frozen reference policy, must not copy CUDA graphs)."""
    graphs = _GRAPHS.get(arbitrator)
    if graphs is None or graphs.device != arbitrator.head.weight.device:
        graphs = _GRAPHS[arbitrator] = ArbitratorGraphs(arbitrator)
    return graphs


__all__ = ["WIDTH_BUCKETS", "ArbitratorGraphs", "graphs_for"]
