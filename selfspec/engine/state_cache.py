"""Slot state cache: per-slot conv and recurrent state of linear-attention (Gated DeltaNet) layers.

Why a second cache beside the slot KV cache: a linear-attention layer (Qwen3.5, Qwen3-Next)
carries no per-position K/V but a fixed-size state per sequence — the last `kernel` inputs of
its causal depthwise conv (`[conv_dim, kernel]`) and the delta-rule matrix (`[heads, k_dim,
v_dim]`, float32 as transformers keeps it). A state cannot be "truncated" like a KV row: after
a verify chunk of n tokens it has absorbed all n. So every forward keeps, per row, what is
needed to put the state back at any position inside its chunk (`_Record`):

- conv: the row's conv window `[zeros(pad) | state(kernel) | real tokens]` the forward built
  anyway; the state after j tokens is the `kernel` columns ending at token j (a slice);
- recurrent: with `snapshots`, the state after every column of the chunk (the token-by-token
  recurrence materialises each one; they are kept by reference, no copy). Without, only the
  final state (prefill pieces: all their tokens are kept).

`settle(slot, start, kept)` after verification puts the slot at `start + kept` (a copy of one
snapshot, nothing recomputed); `rewind` does the same for a later truncation inside the last
chunk. Buffers are preallocated `[num_slots + 1, ...]` like the KV rows (the extra slot is the
scratch row of padding rows). A row whose chunk starts at position 0 reads a zero state, so a
freed slot needs no clearing before its next sequence.

Padding never enters a state: padded columns get decay 0 (log space: the state is multiplied
by exactly 1) and learning rate beta 0 (nothing is written), and the conv window puts the
padding before the cached state, so a row's real tokens see exactly their own history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LinearLayerSpec:
    """Shapes of one linear-attention layer's state."""

    conv_dim: int
    kernel: int
    heads: int
    k_dim: int
    v_dim: int


@dataclass
class _Routing:
    """Where this forward's rows read and write their state."""

    slots: torch.Tensor  # [B] slot per row (scratch slot for padding rows)
    real: torch.Tensor  # [B, T] real-token columns (rows are right-aligned)
    fresh: torch.Tensor  # [B] rows starting at position 0: their initial state is zero
    pads: list[int] | None  # per-row padding on the host (None: static forwards)
    starts: list[int] | None
    snapshots: bool  # keep the per-column recurrent states (verify chunks)


@dataclass
class _Record:
    """What one forward left to put a row's state back inside its chunk (per layer)."""

    row: int
    pad: int
    start: int
    length: int
    windows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, C, K + T]
    states: dict[int, list[torch.Tensor] | None] = field(default_factory=dict)  # layer -> [S_0..S_T] of [B, H, K, V]


class SlotStateCache:
    """Conv and recurrent state per slot for every linear-attention layer of one model."""

    def __init__(
        self,
        layers: dict[int, LinearLayerSpec],
        *,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.specs = dict(layers)
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.device = torch.device(device)
        self.conv = {
            i: torch.zeros((num_slots + 1, s.conv_dim, s.kernel), dtype=dtype, device=device) for i, s in layers.items()
        }
        self.recurrent = {
            i: torch.zeros((num_slots + 1, s.heads, s.k_dim, s.v_dim), dtype=torch.float32, device=device)
            for i, s in layers.items()
        }
        self.routing: _Routing | None = None
        self._records: dict[int, _Record] = {}  # slot -> the last forward's record for it
        self._forward_records: list[tuple[int, _Record]] = []
        self._checkpoints: dict[int, tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]] = {}

    @staticmethod
    def bytes_per_slot(layers: dict[int, LinearLayerSpec], dtype: torch.dtype) -> int:
        elem = torch.finfo(dtype).bits // 8
        return sum(s.conv_dim * s.kernel * elem + s.heads * s.k_dim * s.v_dim * 4 for s in layers.values())

    # ------------------------------------------------------------------ routing
    def prepare_step(
        self, slots: list[int], starts: list[int], lengths: list[int], chunk_len: int, snapshots: bool
    ) -> None:
        """Route the next eager forward (rows right-aligned in a [B, chunk_len] input)."""
        device = self.device
        pads = [chunk_len - n for n in lengths]
        col = torch.arange(chunk_len, device=device).unsqueeze(0)
        real = col >= torch.tensor(pads, device=device).unsqueeze(1)
        self.routing = _Routing(
            slots=torch.tensor(slots, device=device),
            real=real,
            fresh=torch.tensor([s == 0 for s in starts], device=device),
            pads=pads,
            starts=list(starts),
            snapshots=snapshots,
        )
        self.note_rows(slots, starts, lengths, chunk_len)

    def note_rows(self, slots: list[int], starts: list[int], lengths: list[int], chunk_len: int) -> None:
        """The host-side facts of the next forward's rows, for `settle` and `rewind` later."""
        self._forward_records = [
            (slot, _Record(row, chunk_len - n, start, n))
            for row, (slot, start, n) in enumerate(zip(slots, starts, lengths))
        ]

    def set_routing(
        self, *, read_slots: torch.Tensor, write_slots: torch.Tensor, positions: torch.Tensor, snapshots: bool
    ) -> None:
        """Route a static-shape forward from device tensors (no host reads): a column is real
        where it writes to a real slot; a row is fresh where a real column sits at position 0.
        The rows' host-side facts come separately (`note_rows`)."""
        real = write_slots != self.scratch_slot
        self.routing = _Routing(
            slots=read_slots,
            real=real,
            fresh=((positions == 0) & real).any(dim=1),
            pads=None,
            starts=None,
            snapshots=snapshots,
        )

    def end_step(self) -> None:
        for slot, record in self._forward_records:
            self._records[slot] = record
        self._forward_records = []
        self.routing = None

    # ------------------------------------------------------------------ the layer's reads and writes
    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' conv state [B, C, K] and recurrent state [B, H, K, V] (zero for fresh rows)."""
        r = self.routing
        fresh = r.fresh.view(-1, 1, 1)
        conv = self.conv[layer].index_select(0, r.slots)
        rec = self.recurrent[layer].index_select(0, r.slots)
        return conv.masked_fill(fresh, 0), rec.masked_fill(fresh.unsqueeze(-1), 0)

    def write(self, layer: int, window: torch.Tensor, states: list[torch.Tensor] | None, final: torch.Tensor) -> None:
        """Store the rows' new state; keep what `settle`/`rewind` may need."""
        r = self.routing
        kernel = self.specs[layer].kernel
        self.conv[layer].index_copy_(0, r.slots, window[:, :, -kernel:].to(self.conv[layer].dtype))
        self.recurrent[layer].index_copy_(0, r.slots, final.to(torch.float32))
        for _, record in self._forward_records:
            record.windows[layer] = window
            record.states[layer] = states

    # ------------------------------------------------------------------ rollback
    def settle(self, slot: int, position: int) -> bool:
        """Put `slot`'s state at `position` (a position inside its last chunk). False if the last
        forward kept no way back there (a recompute is then needed)."""
        record = self._records.get(slot)
        if record is None:
            return False
        kept = position - record.start
        if kept == record.length:
            return True
        if not 0 <= kept < record.length:
            return False
        if any(states is None for states in record.states.values()):
            return False
        for layer, window in record.windows.items():
            kernel = self.specs[layer].kernel
            begin = record.pad + kept
            self.conv[layer][slot].copy_(window[record.row, :, begin : begin + kernel])
            self.recurrent[layer][slot].copy_(record.states[layer][record.pad + kept][record.row])
        record.length = kept
        return True

    def forget(self, slot: int) -> None:
        """Drop what the last forward kept for `slot` (the slot was freed or overwritten)."""
        self._records.pop(slot, None)
        self._checkpoints.pop(slot, None)

    def copy_slot(self, src: int, dst: int) -> None:
        """Fork: the child's state is the parent's (a copy)."""
        for layer in self.specs:
            self.conv[layer][dst].copy_(self.conv[layer][src])
            self.recurrent[layer][dst].copy_(self.recurrent[layer][src])
        self._records.pop(dst, None)

    def checkpoint(self, slot: int) -> None:
        """Save `slot`'s state (a draft model restores it after a partly rejected proposal)."""
        self._checkpoints[slot] = (
            {i: c[slot].clone() for i, c in self.conv.items()},
            {i: r[slot].clone() for i, r in self.recurrent.items()},
        )

    def restore(self, slot: int) -> bool:
        saved = self._checkpoints.get(slot)
        if saved is None:
            return False
        conv, rec = saved
        for layer in self.specs:
            self.conv[layer][slot].copy_(conv[layer])
            self.recurrent[layer][slot].copy_(rec[layer])
        self._records.pop(slot, None)
        return True
