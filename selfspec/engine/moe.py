"""Mixture-of-experts blocks in a form a CUDA graph can hold, for the static forwards.

transformers runs an experts block (`@use_experts_implementation`: Qwen3-Next, Qwen3-MoE, ...) by
the config's `experts_implementation`. Its "eager" form loops over the experts a step routed to,
found with `nonzero` on the device and read on the host: a host sync that a CUDA graph capture
refuses (the Qwen3-Next capture failed on exactly this and its static shapes ran uncaptured). Two
of transformers' own forms keep everything on the device:

- "batched_mm": every (token, chosen expert) pair gathers its expert's weights and runs a batched
  matmul. Any dtype, any device; it reads the gathered weights once per pair, so it suits the
  small steps a decode or a short verify makes.
- "grouped_mm": the pairs sorted by expert, one grouped GEMM (device-side offsets). Half precision
  on a CUDA device; what a large static step wants.

The static forwards find the blocks once (`experts_modules`), ask `static_experts(blocks, rows,
tokens)` for each shape's form when they build it, and run that shape's body inside
`experts_implementation(blocks, form)`: the form is set for the captured (or static) body only, so the
eager path (prefill pieces beyond the buckets, CPU engines) keeps what the user loaded. Models without
such blocks, or a transformers without the interface, are left as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

BATCHED_BYTES = 256 * 2**20
"""Largest gather of expert weights a "batched_mm" step may make (pairs x one expert's weights)."""


def experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The experts blocks whose forward transformers dispatches by `experts_implementation`."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "gate_up_proj")
        and hasattr(m, "down_proj")
        and hasattr(getattr(m, "config", None), "_experts_implementation")
    ]


def _registered(name: str) -> bool:
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:  # a transformers without the experts interface
        return False
    return name in ALL_EXPERTS_FUNCTIONS


def static_experts(blocks: list[torch.nn.Module], rows: int, tokens: int) -> str | None:
    """The capturable experts form for a static step of `rows` x `tokens` tokens; None where there
    are no dispatched experts blocks or no capturable form applies (they then run as loaded)."""
    if not blocks:
        return None
    block = blocks[0]
    top_k = int(getattr(block.config, "num_experts_per_tok", 1) or 1)
    per_expert = (block.gate_up_proj[0].numel() + block.down_proj[0].numel()) * block.gate_up_proj.element_size()
    if rows * tokens * top_k * per_expert <= BATCHED_BYTES and _registered("batched_mm"):
        return "batched_mm"
    weight = block.gate_up_proj
    if weight.device.type == "cuda" and weight.dtype in (torch.bfloat16, torch.float16) and _registered("grouped_mm"):
        return "grouped_mm"
    return None


@contextlib.contextmanager
def experts_implementation(blocks: list[torch.nn.Module], name: str | None) -> Iterator[None]:
    """Run the `with` body with every one of `blocks` in form `name` (None: as loaded), then restore
    each config's own choice."""
    if name is None or not blocks:
        yield
        return
    configs = {id(m.config): m.config for m in blocks}
    saved = {key: config._experts_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._experts_implementation = name
        yield
    finally:
        for key, config in configs.items():
            config._experts_implementation = saved[key]
