"""Slot KV cache: preallocated per-layer K/V buffers with a slot dimension.

Why slots: SSR forks a request mid-thought; the child must start from the parent's KV
without recomputing it. With a slot per sequence, a fork is a row copy, a rejection of
speculative tokens is a length change, and a finished sequence frees its slot. Buffers are
allocated once (static shapes, ready for CUDA graphs later).

The class is a transformers `Cache`, so the model's own attention layers write into it
through `update()`. transformers 5.17 calls `update(k, v, layer_idx)` with no per-call
kwargs, so the per-step routing (which slot and position each query token writes to, how
many key positions attention reads) lives on the object and is set by the model runner
before each forward (`prepare_step`).

Layout per layer: keys/values `[num_slots + 1, kv_heads, max_len, head_dim]`, sized per layer
(Gemma-4 has other head dims on its full-attention layers). The extra last slot is a scratch
row: padding tokens of a batched step write there, so padding never touches a real sequence.
Buffers start at zero: never-written positions are masked, but a NaN there would still poison
the attention output. Layers that keep no K/V — linear-attention layers (their state lives in
`engine.state_cache`) and layers that reuse an earlier layer's K/V (Gemma-4's KV sharing) —
get no buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from selfspec.engine import kv_write, slot_attention


@dataclass
class _StepRouting:
    """Where this step's tokens go and what attention reads back."""

    write_slots: torch.Tensor  # [B, T] slot per query token (scratch slot for padding)
    write_positions: torch.Tensor  # [B, T] absolute position per query token
    read_slots: torch.Tensor | None  # [B] slot per batch row; None when rows are a contiguous slot range
    read_slot_start: int  # first slot when contiguous
    batch_size: int
    key_length: int  # attention reads positions [0, key_length)
    positions: torch.Tensor | None = None  # [B, T] query positions (direct reads)
    direct: bool = False  # update() returns the whole buffers; slot attention reads them in place


class _SlotLayer:
    """Per-layer view that transformers code may inspect (is_sliding etc.)."""

    is_compileable = True

    def __init__(self, is_sliding: bool, sliding_window: int | None) -> None:
        self.is_sliding = is_sliding
        self.sliding_window = sliding_window
        self.is_initialized = True


class SlotKVCache(Cache):
    """A fixed pool of KV slots shared by all sequences of one engine."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layer_types: list[str] | None = None,
        sliding_window: int | None = None,
        layer_shapes: list[tuple[int, int] | None] | None = None,
    ) -> None:
        """`layer_shapes[i]`: (kv_heads, head_dim) of layer i, or None for a layer without K/V;
        by default every layer has `(num_kv_heads, head_dim)`."""
        types = layer_types or ["full_attention"] * num_layers
        layers = [
            _SlotLayer(t == "sliding_attention", sliding_window if t == "sliding_attention" else None) for t in types
        ]
        super().__init__(layers=layers)
        self.num_slots = num_slots
        self.max_len = max_len
        self.scratch_slot = num_slots
        shapes = layer_shapes if layer_shapes is not None else [(num_kv_heads, head_dim)] * num_layers
        if len(shapes) != num_layers:
            raise ValueError(f"{len(shapes)} layer shapes for {num_layers} layers")
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        for shape in shapes:
            full = None if shape is None else (num_slots + 1, shape[0], max_len, shape[1])
            self.keys.append(None if full is None else torch.zeros(full, dtype=dtype, device=device))
            self.values.append(None if full is None else torch.zeros(full, dtype=dtype, device=device))
        if all(k is None for k in self.keys):
            raise ValueError("a slot KV cache needs at least one layer with K/V")
        self.device = next(k for k in self.keys if k is not None).device
        self._routing: _StepRouting | None = None
        self.kv_write_error: str | None = None
        self.kv_write_pdl = False
        self.kv_write_kernel = kv_write.available(self.device) and self._kv_write_works()
        if self.kv_write_kernel and kv_write.pdl_supported(self.device):
            self.kv_write_pdl = self._kv_write_works(use_pdl=True)

    # ------------------------------------------------------------------ sizing
    @staticmethod
    def bytes_per_slot(config, max_len: int, dtype: torch.dtype) -> int:
        """Memory one slot's K/V needs, for sizing the pool from free memory."""
        elem = torch.finfo(dtype).bits // 8
        return sum(2 * s[0] * max_len * s[1] * elem for s in layer_kv_shapes(config) if s is not None)

    def _kv_write_works(self, use_pdl: bool = False) -> bool:
        """Run the KV-write kernel once into the scratch slot against advanced indexing.

        A kernel this Triton cannot build, or one that writes wrongly, turns itself off here
        (and says why in `kv_write_error`), not inside a captured forward.
        """
        checked: set[tuple[int, ...]] = set()
        for k_buf, v_buf in zip(self.keys, self.values):
            if k_buf is None or tuple(k_buf.shape) in checked:
                continue
            checked.add(tuple(k_buf.shape))  # one check per head count and size (one build each)
            if not self._kv_write_matches(k_buf, v_buf, use_pdl):
                return False
        return True

    def _kv_write_matches(self, k_buf: torch.Tensor, v_buf: torch.Tensor, use_pdl: bool) -> bool:
        _, heads, _, dim = k_buf.shape
        slots = torch.full((1, 2), self.scratch_slot, dtype=torch.long, device=k_buf.device)
        positions = torch.arange(2, device=k_buf.device).view(1, 2)
        states = torch.randn((1, heads, 2, dim), device=k_buf.device).to(k_buf.dtype)
        try:
            kv_write.write_kv(k_buf, v_buf, states, -states, slots, positions, use_pdl=use_pdl)
            ok = torch.equal(k_buf[self.scratch_slot, :, :2], states[0]) and torch.equal(
                v_buf[self.scratch_slot, :, :2], -states[0]
            )
            if not ok:
                self.kv_write_error = "kernel output differs from advanced indexing"
        except Exception as exc:  # noqa: BLE001 - the indexing path stays
            ok, self.kv_write_error = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        k_buf[self.scratch_slot].zero_()
        v_buf[self.scratch_slot].zero_()
        return ok

    # ------------------------------------------------------------------ routing
    def prepare_step(
        self,
        slots: list[int],
        starts: list[int],
        lengths: list[int],
        chunk_len: int,
        key_length: int,
    ) -> None:
        """Route the next forward: row b writes `lengths[b]` tokens at `starts[b]` of `slots[b]`.

        Chunks are right-aligned in the [B, chunk_len] input (padding first), so padding
        positions are routed to the scratch slot.
        """
        device = self.device
        batch = len(slots)
        col = torch.arange(chunk_len, device=device).unsqueeze(0)  # [1, T]
        lengths_t = torch.tensor(lengths, device=device).unsqueeze(1)
        starts_t = torch.tensor(starts, device=device).unsqueeze(1)
        slots_t = torch.tensor(slots, device=device).unsqueeze(1)
        pad = chunk_len - lengths_t  # [B, 1]
        is_real = col >= pad
        write_positions = torch.where(is_real, starts_t + col - pad, col)
        write_slots = torch.where(is_real, slots_t, torch.full_like(slots_t, self.scratch_slot))
        contiguous = slots == list(range(slots[0], slots[0] + batch))
        self._routing = _StepRouting(
            write_slots=write_slots,
            write_positions=write_positions,
            read_slots=None if contiguous else slots_t.squeeze(1),
            read_slot_start=slots[0],
            batch_size=batch,
            key_length=key_length,
        )

    def set_routing(
        self,
        *,
        write_slots: torch.Tensor,
        write_positions: torch.Tensor,
        read_slots: torch.Tensor,
        key_length: int,
        positions: torch.Tensor | None = None,
        direct: bool = False,
    ) -> None:
        """Route the next forward from device tensors (static-shape forwards, CUDA graphs).

        `direct`: attention reads the cache in place (`engine.slot_attention`) instead of a
        gathered copy of the rows' slots; `positions` then gives each query's position.

        Nothing here reads a tensor's value on the host, so a captured graph that replays
        the forward follows whatever the buffers hold at replay time.
        """
        self._routing = _StepRouting(
            write_slots=write_slots,
            write_positions=write_positions,
            read_slots=read_slots,
            read_slot_start=0,
            batch_size=int(read_slots.shape[0]),
            key_length=key_length,
            positions=positions,
            direct=direct and positions is not None,
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this step's K/V into the slots, return each row's keys [B, H, key_length, D]."""
        r = self._routing
        if r is None:
            raise RuntimeError("SlotKVCache.update called outside an engine step (prepare_step not called)")
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        if k_buf is None:
            raise RuntimeError(f"layer {layer_idx} keeps no K/V in this cache (linear attention or shared K/V)")
        if r.direct and self.kv_write_kernel:
            # Static forwards that read the cache in place: K and V in one kernel (see kv_write).
            kv_write.write_kv(
                k_buf, v_buf, key_states, value_states, r.write_slots, r.write_positions, use_pdl=self.kv_write_pdl
            )
        else:
            # [B, H, T, D] -> [B, T, H, D] to match advanced indexing on dims (0, 2).
            k_buf[r.write_slots, :, r.write_positions] = key_states.transpose(1, 2).to(k_buf.dtype)
            v_buf[r.write_slots, :, r.write_positions] = value_states.transpose(1, 2).to(v_buf.dtype)
        if r.direct:
            # Whole buffers out; the attention function takes this step's routing from here.
            layer = self.layers[layer_idx]
            slot_attention.set_pending(r.read_slots, r.positions, r.key_length, layer.sliding_window, k_buf)
            return k_buf, v_buf
        length = r.key_length
        if r.read_slots is None:
            s0 = r.read_slot_start
            keys = k_buf[s0 : s0 + r.batch_size, :, :length]
            values = v_buf[s0 : s0 + r.batch_size, :, :length]
        else:
            keys = k_buf[:, :, :length].index_select(0, r.read_slots)
            values = v_buf[:, :, :length].index_select(0, r.read_slots)
        return keys.to(key_states.dtype), values.to(value_states.dtype)

    def end_step(self) -> None:
        self._routing = None

    # ------------------------------------------------------------------ slot ops
    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Fork: copy the first `length` cached positions of `src` into `dst` (no recompute)."""
        if length <= 0:
            return
        for k_buf, v_buf in zip(self.keys, self.values):
            if k_buf is None:
                continue
            k_buf[dst, :, :length].copy_(k_buf[src, :, :length])
            v_buf[dst, :, :length].copy_(v_buf[src, :, :length])

    # ------------------------------------------------------------------ Cache API bits
    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Only consulted by models when position_ids are missing; the runner always passes them.
        return 0 if self._routing is None else int(self._routing.key_length)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        length = self.max_len if self._routing is None else self._routing.key_length
        return length, 0

    @property
    def is_compileable(self) -> bool:
        return True

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def is_sliding(self) -> list[bool]:
        return [layer.is_sliding for layer in self.layers]


def model_kv_shape(config) -> tuple[int, int, int]:
    """(num_layers, kv_heads, head_dim) for a decoder config whose layers all have one shape
    (the first layer with K/V for models whose layers differ: see `layer_kv_shapes`)."""
    text = _text_config(config)
    shapes = [s for s in layer_kv_shapes(config) if s is not None]
    kv_heads, head_dim = shapes[0] if shapes else (0, 0)
    return text.num_hidden_layers, kv_heads, head_dim


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def layer_attr(text, layer: int, name: str, default=None):
    """A per-layer attribute: `per_layer_config[layer].name` on configs that vary per layer
    (Gemma-4; transformers raises on the global attribute there), else the global one."""
    per_layer = None
    if getattr(text, "is_heterogeneous", False):
        per_layer = text.per_layer_config
    if per_layer is not None:
        return getattr(per_layer[layer], name, default)
    return getattr(text, name, default)


def layer_kv_shapes(config) -> list[tuple[int, int] | None]:
    """(kv_heads, head_dim) per decoder layer, None where a layer keeps no K/V of its own:
    linear-attention layers, and the last `num_kv_shared_layers` layers (they reuse the K/V of an
    earlier layer of their type, as Gemma-4's attention reads them from `shared_kv_states`)."""
    text = _text_config(config)
    num_layers = text.num_hidden_layers
    types = list(getattr(text, "layer_types", None) or ["full_attention"] * num_layers)
    shared = int(getattr(text, "num_kv_shared_layers", 0) or 0)
    first_shared = num_layers - shared if shared else num_layers
    shapes: list[tuple[int, int] | None] = []
    for i in range(num_layers):
        if types[i] == "linear_attention" or i >= first_shared:
            shapes.append(None)
            continue
        heads = layer_attr(text, i, "num_attention_heads")
        kv_heads = layer_attr(text, i, "num_key_value_heads") or heads
        head_dim = layer_attr(text, i, "head_dim") or text.hidden_size // heads
        shapes.append((int(kv_heads), int(head_dim)))
    return shapes
