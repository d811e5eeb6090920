"""A model's linear layers on a CPU as `W @ x.T`: the BLAS path that keeps a few rows cheap.

Why: `F.linear(x, W)` with W = [out, in] multiplies by W transposed. On the CPU, MKL runs that
product for a handful of rows (a decode step of 1–8 sequences: SSR's parent and its draft) far
below memory bandwidth, so a second row cost nearly a second weight read. Measured on 2 cores
(torch 2.13, fp32, SmolLM2-135M shapes, per call):

| weight | rows | `F.linear` | `W @ x.T` |
|---|---|---|---|
| LM head 49152 x 576 | 1 / 2 / 4 | 17.5 / 38.9 / 48.2 ms | 17.7 / 12.2 / 11.4 ms |
| gate+up 3072 x 576 | 1 / 2 / 4 | 1.53 / 2.93 / 2.69 ms | 1.49 / 0.79 / 0.69 ms |
| o_proj 576 x 576 | 1 / 2 / 4 | 0.32 / 0.42 / 0.44 ms | 0.33 / 0.19 / 0.22 ms |

One row goes to BLAS's matrix-vector routine, which ran on one thread; two rows run the threaded
GEMM and read the weight once for both. So with several threads a lone row is computed as two
(itself twice, sliced back): SmolLM2's 210 decoder projections took 49 ms that way against 58 ms
through the vector routine (2 threads; with 1 thread the vector routine won, 62 against 78 ms, and
is kept). The batch-1 step then gets the batch-2 step's kernel, and on this MKL a row's values
are the same bits at batch 1 and 2. Above `MAX_ROWS` rows (prefill pieces) `F.linear` is kept: there MKL's own
blocking is as fast and the weight-major product has no edge.

The swap is scoped to the runner's own forwards (as `fusion.fused()` is), so transformers'
`generate` on the same model object still runs its own code. Linear layers whose forward is
already replaced (the fused projections of `engine.fusion`) keep their route.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

ENV = "SELFSPEC_CPU_LINEAR"
MAX_ROWS = 16


def enabled() -> bool:
    """`SELFSPEC_CPU_LINEAR=0` turns the path off (diagnostics, A/B timing)."""
    return os.environ.get(ENV, "1").strip() != "0"


def weight_major_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` computed as `(weight @ x.T).T` for at most `MAX_ROWS` rows."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows > MAX_ROWS:
        return torch.nn.functional.linear(x, weight, bias)
    if rows == 1:
        if torch.get_num_threads() == 1:
            return torch.nn.functional.linear(x, weight, bias)  # one thread: the vector routine is faster
        flat = torch.cat((flat, flat))  # the threaded GEMM, not the one-thread matrix-vector routine
    out = torch.mm(weight, flat.T).T[:rows].contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def _forward(linear: torch.nn.Linear):
    weight, bias = linear.weight, linear.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        return weight_major_linear(x, weight, bias)

    return forward


def applies_to(model: torch.nn.Module) -> bool:
    """A model on the CPU (other devices keep their own GEMM paths)."""
    return next(model.parameters()).device.type == "cpu"


def plain_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's `nn.Linear` layers that still run the class's forward (decoder projections and
    the LM head; not those `engine.fusion` rerouted). Found once per runner: a step only swaps."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)]


@contextlib.contextmanager
def weight_major_linears(linears: list[torch.nn.Linear]) -> Iterator[None]:
    """Within the block, these linears (`plain_linears`) compute `weight_major_linear` (see the
    module docstring)."""
    swapped = [m for m in linears if "forward" not in vars(m)]
    for linear in swapped:
        linear.forward = _forward(linear)  # instance attribute: shadows the class's forward
    try:
        yield
    finally:
        for linear in swapped:
            del linear.forward
