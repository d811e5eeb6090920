"""The LM head on a CPU as `W @ h.T`: MKL's fast path for a few rows against a wide weight.

Why: `F.linear(h, W)` with W = [vocab, hidden] multiplies by W transposed. On the CPU, MKL runs
that product for a handful of rows (a decode step of 1–8 sequences: SSR's parent and its draft)
far below memory bandwidth. On 2 cores, SmolLM2's 49,152 x 576 head took 25.9 ms for 2 rows
against 13.3 ms for 1, while `W @ h.T` took 5.8 ms for 2 rows and 12.4 ms for 1. The head is
the largest single GEMM of a small model's step, so this alone decides much of what a second
row costs. The swap is scoped to the runner's own forwards (as `fusion.fused()` is), so
transformers' `generate` on the same model object still runs its own code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _weight_major(head: torch.nn.Linear):
    def forward(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        out = (head.weight @ flat.T).T
        if head.bias is not None:
            out = out + head.bias
        return out.reshape(*hidden.shape[:-1], out.shape[-1])

    return forward


def applies_to(model: torch.nn.Module) -> bool:
    """A plain linear head on the CPU (other heads and devices keep their own path)."""
    head = model.get_output_embeddings()
    return type(head) is torch.nn.Linear and head.weight.device.type == "cpu"


@contextlib.contextmanager
def weight_major_head(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, the model's LM head computes `W @ h.T` (see the module docstring)."""
    head = model.get_output_embeddings()
    head.forward = _weight_major(head)  # instance attribute: shadows the class's forward
    try:
        yield
    finally:
        del head.forward
