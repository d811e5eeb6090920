"""CUDA-graph replays of the arbitrator's one-state inference forward.

Why: CoSpec asks the arbitrator at nearly every verification round (the draft mismatches
the target about once per 2.8 tokens on the thinker tasks), one state at a time, on the
critical path. Eagerly that forward is ~460 small kernels (8 decoder layers, LoRA on four
projections each, transformers' rotary and norms), each launched from Python: on the H200
the GPU sat at ~5% while CoSpec rollouts ran, an RL iteration (12 rollouts of ≤ 1,280
tokens) did not finish in 270 s, and the eval did not finish one task in 16 minutes. Replaying a captured graph costs one
launch.

How: states are right-padded to a width bucket (64, 128, …): padding keys are invisible
and padding queries attend only to themselves (`hybrid_layout`'s rule), so the real rows
see exactly what they see unpadded; only float reduction order may differ. One static
input buffer per bucket — the padded token ids and the three block lengths, one host-to-
device copy per decision — and one graph per bucket, captured when the policy is built
(all buckets up to the widest state it can make). The graph builds positions and the
[W, W] hybrid mask on the GPU from the lengths: building them on the host cost ~110 ms
per decision on the H200 machine (multi-threaded CPU ops on [576, 576] tensors
while other processes kept the cores busy), which erased what the graph saved. The graph reads the
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

from selfspec.engine.static_forward import capture_graph
from selfspec.spec.cospec.arbitrator import ArbitrationState, ArbitratorBatch, hybrid_layout, state_tokens

if TYPE_CHECKING:
    from selfspec.spec.cospec.arbitrator import Arbitrator

WIDTH_BUCKETS: tuple[int, ...] = (64, 128, 256, 384, 512, 576, 640, 768, 1024, 1536, 2048)
"""Padded state widths. The eval's states are ≤ 512 prefix + 2K + 1 (K = 8: 529 → 576)."""


@dataclass
class _Captured:
    packed: torch.Tensor  # [W + 3] long static input: padded token ids, then (P, D, T)
    logits: torch.Tensor  # [1] static output
    graph: torch.cuda.CUDAGraph | None

    @property
    def width(self) -> int:
        return self.packed.shape[0] - 3


class ArbitratorGraphs:
    """Per-bucket static buffers and graphs for one arbitrator (module doc)."""

    def __init__(
        self, arbitrator: "Arbitrator", *, capture: bool | None = None, buckets: tuple[int, ...] = WIDTH_BUCKETS
    ) -> None:
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
        lengths = [len(state.prefix), len(state.draft_block), len(state.target_block)]
        entry.packed.copy_(torch.tensor(state_tokens(state, width) + lengths, dtype=torch.long))
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
        # A valid placeholder state (P = width - 3, D = T = 1) for the warm-up and capture runs.
        packed = torch.zeros(width + 3, dtype=torch.long, device=self.device)
        packed[width:] = torch.tensor([width - 3, 1, 1])
        entry = _Captured(packed, torch.zeros(1, device=self.device), None)
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
        width = entry.width
        input_ids = entry.packed[:width].view(1, width)
        positions, allowed, decision = hybrid_layout(entry.packed[width:].view(1, 3), width)
        with torch.inference_mode():
            entry.logits.copy_(arbitrator(ArbitratorBatch(input_ids, positions, allowed, decision)))

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
