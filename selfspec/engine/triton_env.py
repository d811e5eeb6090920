"""Where the engine's Triton kernels can run, shared by slot attention, skinny GEMMs and the K/V write.

Triton is on the GPU machine (with torch); on a CPU it runs kernels only in its interpreter
(`TRITON_INTERPRET=1`, tests). Programmatic dependent launch needs Hopper or newer and a Triton
that has `gdc_wait`.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment
    triton = tl = None
    HAVE_TRITON = False


def available(device: torch.device) -> bool:
    """Whether the engine's Triton kernels can run on tensors of this device."""
    if not HAVE_TRITON:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: Hopper or newer, and a Triton that has it."""
    if device.type != "cuda" or not HAVE_TRITON or not hasattr(tl.extra.cuda, "gdc_wait"):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9
