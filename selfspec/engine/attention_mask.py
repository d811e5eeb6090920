"""4D attention masks for a batch of right-aligned chunks over slot caches.

Each row carries its own chunk at its own position: query j of row b sits at absolute
position p = start_b + j - pad_b and may see every cached key of its own slot at positions
<= p (within the window on sliding layers), nothing else. Other rows never leak in because
each row reads only its own slot. The mask is additive (0 / dtype-min): eager attention adds
the mask to the scores, so a boolean mask would be silently wrong there; dtype-min rather
than -inf keeps fully masked padding rows finite.
"""

from __future__ import annotations

import torch


def query_positions(starts: torch.Tensor, lengths: torch.Tensor, chunk_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Absolute positions [B, T] of the query tokens (0 for padding) and the real-token mask."""
    col = torch.arange(chunk_len, device=starts.device).unsqueeze(0)
    pad = (chunk_len - lengths).unsqueeze(1)
    is_real = col >= pad
    positions = torch.where(is_real, starts.unsqueeze(1) + col - pad, torch.zeros_like(col))
    return positions, is_real


def build_additive_mask(
    positions: torch.Tensor,
    key_length: int,
    dtype: torch.dtype,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """[B, 1, T, key_length] additive mask: causal over each row's own slot, optional window."""
    keys = torch.arange(key_length, device=positions.device).view(1, 1, -1)
    q = positions.unsqueeze(-1)  # [B, T, 1]
    allowed = keys <= q
    if sliding_window is not None:
        allowed = allowed & (keys > q - sliding_window)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)
