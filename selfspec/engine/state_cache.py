"""Slot state cache: per-slot conv and recurrent state of linear-attention (Gated DeltaNet) layers.

Why a second cache beside the slot KV cache: a linear-attention layer (Qwen3.5, Qwen3-Next)
carries no per-position K/V but a fixed-size state per sequence — the last `kernel` inputs of
its causal depthwise conv (`[conv_dim, kernel]`) and the delta-rule matrix (`[heads, k_dim,
v_dim]`, float32 as transformers keeps it). A state cannot be "truncated" like a KV row: after
a verify chunk of n tokens it has absorbed all n. So a verify forward keeps, per row, what is
needed to put the state back at any position inside its chunk:

- conv: the row's conv window `[zeros(pad) | state(kernel) | tokens]` the forward built
  anyway; the state after j real tokens is the `kernel` columns starting at `pad + j`;
- recurrent, one of two ways (`rollback`):
  - `"snapshots"`: the state after every column of the chunk (the torch token-by-token
    recurrence materialises each one): T + 1 full states per layer. Padding columns leave a
    state as it is, so the state after j real tokens is column `pad + j`.
  - `"recompute"`: the chunk's initial state and its small per-token inputs (the conv output
    q|k|v, the decay g and beta: T x (conv_dim + 2H) values per layer instead of T + 1 states
    of H x Dk x Dv); `settle` runs the recurrence again over the accepted prefix from the
    initial state (one fused-recurrent kernel call per layer with fla, `recurrent_rule`
    otherwise). The same kernel ran the verify chunk, so the settled state is the one the
    verify forward had at that position. The default where fla's kernels run
    (`fla_kernels`): the fast kernels emit no per-position states, and this bounds the
    memory a slot needs for rollback.

Where they are kept depends on the forward:

- eager forwards keep them by reference (`_Record.windows` / `states` / `inputs`, no copy);
- static forwards (CUDA graph replays) write them into cache-owned snapshot buffers, one row
  per slot (`[num_slots + 1, C, K + T]` and `[num_slots + 1, T + 1, H, K, V]` per layer, or
  for `"recompute"` the initial state `[num_slots + 1, H, K, V]`, the inputs
  `[num_slots + 1, T, C]` and g|beta `[num_slots + 1, T, 2, H]`; T the largest token bucket a
  verify forward may use). A tensor made inside a captured graph lives in the graph's memory
  pool and the next replay overwrites it; a buffer row per slot is only written by that slot's
  next verify forward, so several replays (of one shape or not) may run before `settle` picks
  a position. Allocated once, before the first capture that writes them.

Routing: eager forwards route from host lists (`prepare_step`); static forwards from device
tensors the static body computes from its input buffer (`set_routing`: nothing on the host, so
the routing is part of the captured graph), with padding rows routed to the scratch slot
`num_slots`. The host-side facts `settle` needs (pad, start, length per slot) are noted after
a static forward (`note_static_rows`), outside the graph.

`settle(slot, position)` after verification puts the slot at `position` (a copy of one
snapshot, or the recompute of the accepted prefix). State buffers are `[num_slots + 1, ...]` like the KV rows. A row
whose chunk starts at position 0 reads a zero state, so a freed slot needs no clearing.

Padding never enters a state: padded columns get decay 0 (log space: the state is multiplied
by exactly 1) and learning rate beta 0 (nothing is written), and the conv window puts the
padding before the cached state, so a row's real tokens see exactly their own history. The
scratch slot therefore stays as it was (zero) whatever padding rows run through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from selfspec.engine import fla_kernels, slot_delta_rule

Rollback = Literal["snapshots", "recompute"]


def default_rollback(device: torch.device | str | None = None) -> Rollback:
    """`"recompute"` where fla's kernels run (they keep no per-position states), `"snapshots"`
    on the torch path. No device: whether fla is usable at all (for sizing)."""
    if device is None:
        return "recompute" if fla_kernels.USABLE else "snapshots"
    return "recompute" if fla_kernels.applies(torch.device(device)) else "snapshots"


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
    snapshots: bool  # keep the per-column states (verify chunks)
    buffered: bool  # static forward: snapshots go to the cache's snapshot buffers (row = slot)


@dataclass
class _Record:
    """What one forward left to put a slot's state back inside its chunk."""

    pad: int
    start: int
    length: int
    snapshots: bool  # False: only the state after the whole chunk exists
    row: int | None = None  # eager: the row in the forward's tensors; None: the snapshot buffers
    windows: dict[int, torch.Tensor] = field(default_factory=dict)  # eager: layer -> [B, C, K + T]
    states: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # eager: layer -> [S_0..S_T]
    inputs: dict[int, tuple[torch.Tensor, ...]] = field(
        default_factory=dict
    )  # eager recompute: layer -> (qkv, g, beta, S_0)


class SlotStateCache:
    """Conv and recurrent state per slot for every linear-attention layer of one model."""

    def __init__(
        self,
        layers: dict[int, LinearLayerSpec],
        *,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
        rollback: Rollback | None = None,
    ) -> None:
        self.specs = dict(layers)
        self.rollback: Rollback = rollback or default_rollback(device)
        if self.rollback not in ("snapshots", "recompute"):
            raise ValueError(f"rollback must be 'snapshots' or 'recompute', not {self.rollback!r}")
        self.num_slots = num_slots
        self.scratch_slot = num_slots
        self.device = torch.device(device)
        self.dtype = dtype
        self.conv = {
            i: torch.zeros((num_slots + 1, s.conv_dim, s.kernel), dtype=dtype, device=device) for i, s in layers.items()
        }
        self.recurrent = {
            i: torch.zeros((num_slots + 1, s.heads, s.k_dim, s.v_dim), dtype=torch.float32, device=device)
            for i, s in layers.items()
        }
        # Snapshot buffers of static verify forwards (`reserve_snapshots`); 0 tokens: none yet.
        self.snapshot_tokens = 0
        self.conv_snapshots: dict[int, torch.Tensor] = {}
        self.recurrent_snapshots: dict[int, torch.Tensor] = {}  # "snapshots"
        self.initial_snapshots: dict[int, torch.Tensor] = {}  # "recompute": S_0 per slot
        self.input_snapshots: dict[int, torch.Tensor] = {}  # "recompute": conv output q|k|v per column
        self.gate_snapshots: dict[int, torch.Tensor] = {}  # "recompute": g and beta per column (fp32)
        self.routing: _Routing | None = None
        self._records: dict[int, _Record] = {}  # slot -> the last forward's record for it
        self._forward_records: list[tuple[int, _Record]] = []
        self._checkpoints: dict[int, tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]] = {}

    @staticmethod
    def bytes_per_slot(layers: dict[int, LinearLayerSpec], dtype: torch.dtype) -> int:
        elem = torch.finfo(dtype).bits // 8
        return sum(s.conv_dim * s.kernel * elem + s.heads * s.k_dim * s.v_dim * 4 for s in layers.values())

    @staticmethod
    def snapshot_bytes_per_slot(
        layers: dict[int, LinearLayerSpec], dtype: torch.dtype, tokens: int, rollback: Rollback | None = None
    ) -> int:
        """What `reserve_snapshots(tokens)` costs per slot (`rollback` None: `default_rollback()`)."""
        if tokens <= 0:
            return 0
        elem = torch.finfo(dtype).bits // 8
        if (rollback or default_rollback()) == "recompute":
            return sum(
                s.conv_dim * (s.kernel + tokens) * elem
                + tokens * (s.conv_dim * elem + 2 * s.heads * 4)
                + s.heads * s.k_dim * s.v_dim * 4
                for s in layers.values()
            )
        return sum(
            s.conv_dim * (s.kernel + tokens) * elem + (tokens + 1) * s.heads * s.k_dim * s.v_dim * 4
            for s in layers.values()
        )

    def reserve_snapshots(self, tokens: int) -> None:
        """Allocate the snapshot buffers of static verify forwards of up to `tokens` columns.
        Once: captured graphs hold their addresses, so they are never reallocated."""
        if self.snapshot_tokens:
            if tokens > self.snapshot_tokens:
                raise ValueError(f"snapshot buffers hold {self.snapshot_tokens} tokens, {tokens} asked")
            return
        slots = self.num_slots + 1
        for i, s in self.specs.items():
            self.conv_snapshots[i] = torch.zeros(
                (slots, s.conv_dim, s.kernel + tokens), dtype=self.dtype, device=self.device
            )
            if self.rollback == "recompute":
                self.initial_snapshots[i] = torch.zeros(
                    (slots, s.heads, s.k_dim, s.v_dim), dtype=torch.float32, device=self.device
                )
                self.input_snapshots[i] = torch.zeros((slots, tokens, s.conv_dim), dtype=self.dtype, device=self.device)
                self.gate_snapshots[i] = torch.zeros(
                    (slots, tokens, 2, s.heads), dtype=torch.float32, device=self.device
                )
                continue
            self.recurrent_snapshots[i] = torch.zeros(
                (slots, tokens + 1, s.heads, s.k_dim, s.v_dim), dtype=torch.float32, device=self.device
            )
        self.snapshot_tokens = tokens

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
            snapshots=snapshots,
            buffered=False,
        )
        self._forward_records = [
            (slot, _Record(pad, start, n, snapshots, row=row))
            for row, (slot, start, n, pad) in enumerate(zip(slots, starts, lengths, pads))
        ]

    def set_routing(
        self, *, read_slots: torch.Tensor, write_slots: torch.Tensor, positions: torch.Tensor, snapshots: bool
    ) -> None:
        """Route a static-shape forward from device tensors (no host reads, so it can be
        captured): a column is real where it writes to a real slot; a row is fresh where a real
        column sits at position 0. `snapshots` is fixed per captured graph. Padding rows read and
        write the scratch slot (their `read_slots`)."""
        if snapshots and not self.snapshot_tokens:
            raise RuntimeError("a static verify forward needs reserve_snapshots() first")
        real = write_slots != self.scratch_slot
        self.routing = _Routing(
            slots=read_slots,
            real=real,
            fresh=((positions == 0) & real).any(dim=1),
            snapshots=snapshots,
            buffered=True,
        )

    def note_static_rows(
        self, slots: list[int], starts: list[int], lengths: list[int], chunk_len: int, snapshots: bool
    ) -> None:
        """The host-side facts of a static forward that just ran (or was replayed): where its
        rows' snapshots lie in the buffers (row = slot) for `settle` later."""
        for slot, start, n in zip(slots, starts, lengths):
            self._records[slot] = _Record(chunk_len - n, start, n, snapshots)

    def end_step(self) -> None:
        for slot, record in self._forward_records:
            self._records[slot] = record
        self._forward_records = []
        self.routing = None

    # ------------------------------------------------------------------ the layer's reads and writes
    def read_recurrent(self, layer: int) -> torch.Tensor:
        """The rows' recurrent state [B, H, K, V] (zero for fresh rows). The conv state is read
        inside the layer's preparation (`linear_attention.prepare_chunk`), and on a GPU's decode and
        verify steps the recurrent state in its slots (`slot_delta_rule`)."""
        r = self.routing
        return self.recurrent[layer].index_select(0, r.slots).masked_fill(r.fresh.view(-1, 1, 1, 1), 0)

    def write(
        self,
        layer: int,
        window: torch.Tensor,
        states: list[torch.Tensor] | None,
        final: torch.Tensor | None,
        inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Store the rows' new state; keep what `settle` may need (by reference in eager
        forwards, in the snapshot buffers' slot rows in static ones): the per-column `states`
        (`"snapshots"`) or the chunk's `inputs` (`"recompute"`: conv output q|k|v [B, T, C],
        g and beta [B, T, H], initial state [B, H, K, V])."""
        r = self.routing
        kernel = self.specs[layer].kernel
        self.conv[layer].index_copy_(0, r.slots, window[:, :, -kernel:].to(self.conv[layer].dtype))
        if final is not None:  # None: the kernel wrote the rows' states in their slots
            self.recurrent[layer].index_copy_(0, r.slots, final.to(torch.float32))
        if not r.snapshots:
            return
        if r.buffered:
            width = window.shape[-1]
            if width - kernel > self.snapshot_tokens:
                raise RuntimeError(f"a {width - kernel}-token verify forward exceeds the snapshot buffers")
            self.conv_snapshots[layer][:, :, :width].index_copy_(0, r.slots, window.to(self.dtype))
            if self.rollback == "recompute":
                qkv, g, beta, initial = self._recompute_inputs(inputs)
                columns = qkv.shape[1]
                self.input_snapshots[layer][:, :columns].index_copy_(0, r.slots, qkv.to(self.dtype))
                gates = torch.stack((g.to(torch.float32), beta.to(torch.float32)), dim=2)
                self.gate_snapshots[layer][:, :columns].index_copy_(0, r.slots, gates)
                self.initial_snapshots[layer].index_copy_(0, r.slots, initial.to(torch.float32))
                return
            buffer = self.recurrent_snapshots[layer]
            for column, state in enumerate(states):
                buffer[:, column].index_copy_(0, r.slots, state.to(torch.float32))
            return
        if self.rollback == "recompute":
            inputs = self._recompute_inputs(inputs)
        for _, record in self._forward_records:
            record.windows[layer] = window
            if self.rollback == "recompute":
                record.inputs[layer] = inputs
            else:
                record.states[layer] = states

    @staticmethod
    def _recompute_inputs(inputs):
        if inputs is None:
            raise RuntimeError("a verify forward under rollback='recompute' must pass its chunk's inputs")
        return inputs

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
        if not 0 <= kept < record.length or not record.snapshots:
            return False
        column = record.pad + kept
        for layer, spec in self.specs.items():
            if record.row is None:
                window = self.conv_snapshots[layer][slot]
            else:
                window = record.windows[layer][record.row]
            self.conv[layer][slot].copy_(window[:, column : column + spec.kernel])
            if self.rollback == "recompute":
                state = self._recompute(layer, slot, record, kept)
            elif record.row is None:
                state = self.recurrent_snapshots[layer][slot, column]
            else:
                state = record.states[layer][column][record.row]
            self.recurrent[layer][slot].copy_(state)
        record.length = kept
        return True

    def _recompute(self, layer: int, slot: int, record: _Record, kept: int) -> torch.Tensor:
        """The state after the first `kept` real tokens of the slot's last chunk: the recurrence
        over those columns again, from the chunk's initial state (padding columns skipped: they
        leave a state as it is)."""
        cols = slice(record.pad, record.pad + kept)
        if record.row is None:
            qkv = self.input_snapshots[layer][slot, cols]
            g = self.gate_snapshots[layer][slot, cols, 0]
            beta = self.gate_snapshots[layer][slot, cols, 1]
            initial = self.initial_snapshots[layer][slot]
        else:
            row_qkv, row_g, row_beta, row_initial = record.inputs[layer]
            qkv, g, beta = row_qkv[record.row, cols], row_g[record.row, cols], row_beta[record.row, cols]
            initial = row_initial[record.row]
        if kept == 0:
            return initial
        spec = self.specs[layer]
        value_dim = spec.heads * spec.v_dim
        key_dim = (spec.conv_dim - value_dim) // 2
        query, key, value = torch.split(qkv.unsqueeze(0), [key_dim, key_dim, value_dim], dim=-1)
        query = query.reshape(1, kept, -1, spec.k_dim)
        key = key.reshape(1, kept, -1, spec.k_dim)
        value = value.reshape(1, kept, spec.heads, spec.v_dim)
        g, beta, initial = g.unsqueeze(0), beta.unsqueeze(0), initial.unsqueeze(0)
        if slot_delta_rule.applies(qkv.device, qkv.dtype):  # the kernel the verify forward ran
            _, final = slot_delta_rule.recurrent(query, key, value, g, beta, initial)
        elif fla_kernels.applies(qkv.device, qkv.dtype):
            _, final = fla_kernels.recurrent(query, key, value, g, beta, initial)
        else:
            from selfspec.engine.linear_attention import recurrent_rule  # the layer's module imports this one

            _, final, _ = recurrent_rule(query, key, value, g, beta, initial, False)
        return final[0]

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
