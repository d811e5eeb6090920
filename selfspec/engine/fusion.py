"""Fused pointwise pieces for the engine's forwards: torch.compile on norms, MLPs and rotary.

Why: once a step is a CUDA graph replay, its cost is roughly the number of kernels. An
eager RMSNorm is ~7 kernels (casts, pow, mean, rsqrt, two muls), rotary ~10, the MLP's
activation-times-up 2; inductor fuses each into one. GEMMs and attention stay as they are.

Only these small, cache-free functions are compiled (with dynamic shapes, so one
compilation serves every bucket), not the whole model: the slot cache's Python routing and
transformers' mask plumbing stay eager, where they are cheap because they only run while a
graph is captured.

The model object stays usable by other code (e.g. `generate` as a baseline in the same
process): the compiled versions are used only inside `fused()`, which the engine's runner
enters around its own forwards.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Iterator

import torch

_state = threading.local()

POINTWISE_SUFFIXES = ("RMSNorm", "MLP")


def fused_active() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def fused() -> Iterator[None]:
    """Use the compiled pieces (where a model has them) for forwards in this block."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _dispatch(eager: Callable, compiled: Callable) -> Callable:
    def forward(*args, **kwargs):
        if fused_active():
            return compiled(*args, **kwargs)
        return eager(*args, **kwargs)

    forward.__wrapped__ = eager  # type: ignore[attr-defined]
    forward._selfspec_fused = True  # type: ignore[attr-defined]
    return forward


def compile_pointwise_modules(model: torch.nn.Module, backend: str = "inductor") -> list[str]:
    """Give the model's norm and MLP modules, and its rotary function, compiled twins.

    Returns what was wrapped (class or function names), for reports. Idempotent.
    """
    # One compiled entry serves all instances of a class (parameters are graph inputs);
    # the limit only matters if a model mixes many norm variants.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    wrapped: set[str] = set()
    compiled_by_class: dict[type, Callable] = {}
    for module in model.modules():
        cls = type(module)
        if not cls.__name__.endswith(POINTWISE_SUFFIXES):
            continue
        if getattr(module.forward, "_selfspec_fused", False):
            continue
        compiled = compiled_by_class.get(cls)
        if compiled is None:
            compiled = torch.compile(cls.forward, dynamic=True, backend=backend)
            compiled_by_class[cls] = compiled
        eager = module.forward
        module.forward = _dispatch(eager, lambda *a, _m=module, _c=compiled, **k: _c(_m, *a, **k))
        wrapped.add(cls.__name__)
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            modeling = sys.modules.get(type(module).__module__)
            rotary = getattr(modeling, "apply_rotary_pos_emb", None)
            if rotary is not None and not getattr(rotary, "_selfspec_fused", False):
                setattr(modeling, "apply_rotary_pos_emb", _dispatch(rotary, torch.compile(rotary, dynamic=True, backend=backend)))
                wrapped.add(f"{modeling.__name__}.apply_rotary_pos_emb")
    return sorted(wrapped)
