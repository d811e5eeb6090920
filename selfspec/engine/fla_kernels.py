"""flash-linear-attention (fla) kernels for the engine's Gated DeltaNet forward: the one module that imports fla.

Why fla: the torch path runs the delta rule token by token in Python (one handful of kernel
launches per token per layer), so a decode step and every verify chunk cost far more than the
state they move. fla's Triton kernels (the ones vLLM and SGLang run for Qwen3-Next / Qwen3.5)
do the recurrence of a whole chunk in one launch: `fused_recurrent_gated_delta_rule` walks the
tokens inside the kernel (decode, verify chunks, and the recompute at `settle`),
`chunk_gated_delta_rule` is the chunked (WY) form for long prefill pieces.

Whether fla is used is decided once, at import: a CUDA device, fla importable (`pip install
selfspec[fla]`), and the switch `SELFSPEC_FLA` not set to `0`. Otherwise, and for tensors that
are not on CUDA, the engine runs its torch path (`linear_attention`), whose numerics do not
change. `load()` imports the kernels whatever the device, for Triton's interpreter
(`TRITON_INTERPRET=1`, CPU tensors) in tests.

Both kernels take what `recurrent_rule` takes ([B, T, Hk, Dk] queries and keys, [B, T, H, Dv]
values, log-space decay `g` and `beta` [B, T, H], an fp32 state [B, H, Dk, Dv]) and normalise
q and k inside (`use_qk_l2norm_in_kernel`), scale 1/sqrt(Dk) as transformers does. Grouped heads
(Hk < H) are read in place: value head h uses key head h // (H / Hk), as `repeat_interleave` does.
Neither reads a device value on the host, so both run inside captured CUDA graphs (Triton's
autotuning happens in the warm-up runs before a capture).
"""

from __future__ import annotations

import os
from typing import Callable

import torch

ENV_SWITCH = "SELFSPEC_FLA"
"""`SELFSPEC_FLA=0` forces the torch path even where fla could run."""

CHUNK_MIN_TOKENS = 64
"""Chunks without rollback of at least this many tokens run fla's chunked kernel; shorter ones
(decode, small prefill pieces) the fused recurrent kernel, which walks the tokens in one launch."""

Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]


_loaded: tuple[Kernel, Kernel] | None = None


def load() -> tuple[Kernel, Kernel]:
    """fla's (fused recurrent, chunked) gated delta rule, imported once (raises ImportError when
    fla is absent): the layers call it per layer and step, and at every settle."""
    global _loaded
    if _loaded is None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        _loaded = (fused_recurrent_gated_delta_rule, chunk_gated_delta_rule)
    return _loaded


def _resolve() -> tuple[bool, str]:
    if os.environ.get(ENV_SWITCH, "").strip() == "0":
        return False, f"{ENV_SWITCH}=0"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        load()
    except ImportError as exc:
        return False, f"fla not importable ({exc}); pip install selfspec[fla]"
    return True, "fla-core kernels"


USABLE, REASON = _resolve()
"""Whether the engine runs fla's kernels on CUDA tensors, and why (not)."""


def applies(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """Whether tensors on `device` of `dtype` run fla's kernels: fla usable, the device CUDA, and
    not float32. Triton's dots round fp32 inputs to TF32, which moved an fp32 Qwen3.5-4B's logits
    by ~0.5% of their scale on an H100; an fp32 engine is the one users run to get the eager
    model's numbers, so it keeps the torch path."""
    return USABLE and device.type == "cuda" and dtype != torch.float32


def _rule(kernel: Kernel, query, key, value, g, beta, initial_state):
    return kernel(
        query,
        key,
        value,
        g=g,
        beta=beta,
        initial_state=initial_state.to(torch.float32),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


def recurrent(query, key, value, g, beta, initial_state, kernel: Kernel | None = None):
    """The delta rule over every column, token by token in one launch: (out [B, T, H, Dv] in
    the values' dtype, final state [B, H, Dk, Dv] fp32). `kernel` overrides the loaded one
    (tests run it under Triton's interpreter)."""
    return _rule(kernel or load()[0], query, key, value, g, beta, initial_state)


def chunked(query, key, value, g, beta, initial_state, kernel: Kernel | None = None):
    """The delta rule in chunked (WY) form for long chunks: (out, final state), as `recurrent`."""
    return _rule(kernel or load()[1], query, key, value, g, beta, initial_state)
