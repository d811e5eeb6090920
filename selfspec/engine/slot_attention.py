"""Attention that reads the slot KV cache directly: one kernel per layer instead of five.

Why: in a captured decode step of a small model, each kernel costs ~3 µs whatever it does.
transformers' path per layer is: gather the rows' slots out of the cache (K and V), repeat
K/V heads for grouped queries (K and V), then SDPA — five kernels, ~18 µs for SmolLM2. This
Triton kernel reads each row's slot, causal range (and sliding window) from device tensors,
handles grouped queries itself and writes the output in the layout the output projection
wants. Long caches are split across programs (flash-decoding) and reduced by a second small
kernel, so a step's attention cost follows the cached length in fixed-size pieces.

The kernel runs on the GPU; `TRITON_INTERPRET=1` runs it on CPU tensors for tests. Without
Triton (or on CPU without the interpreter) the engine keeps transformers' attention.
"""

from __future__ import annotations

import math
import os
import threading

import torch

from selfspec.engine.triton_env import HAVE_TRITON, available, tl, triton  # noqa: F401

KEYS_PER_SPLIT_ENV = "SELFSPEC_SLOT_ATTENTION_KEYS_PER_SPLIT"


def keys_per_split() -> int:
    """Keys one program covers at most (then a reduce kernel merges the splits): 512, or
    `SELFSPEC_SLOT_ATTENTION_KEYS_PER_SPLIT` (a multiple of 16; multiples of the 64-key block
    load no masked keys).

    Why 512 (`benchmarks/decode_kernels.py`, an H100, Qwen3-8B's heads, µs per layer): a one-row
    decode over 512 to 2,048 keys runs too few programs (8 K/V heads x 1-4 splits) and takes 10.3 /
    12.7 µs with 512 against 8.2 / 9.2 with 256 and 6.6 / 8.7 with 128; but at 32 rows, where the
    engine trails vLLM, smaller splits cost more (512 keys: 26.2 / 31.1 / 31.2; 8,192: 365 / 378 /
    393), and at 8,192 keys one row takes 15.2 / 15.4 / 21.5 (the reduce kernel merges 16-64
    splits). A one-request server with contexts under a few thousand keys may prefer 256. The
    boundaries sit at fixed multiples of this number whatever the batch, bucket or verify width, so
    a position gets the same bits in a decode and in a verify forward for any value; it is read once,
    at import."""
    value = int(os.environ.get(KEYS_PER_SPLIT_ENV, "512"))
    if value < 16 or value % 16:
        raise ValueError(f"{KEYS_PER_SPLIT_ENV} must be a positive multiple of 16, got {value}")
    return value


KEYS_PER_SPLIT = keys_per_split()
TOKEN_BLOCKS_ENV = "SELFSPEC_SLOT_ATTENTION_TOKEN_BLOCKS"
"""Set to 1: a verify chunk's consecutive query tokens share a program (`tokens_per_program`)."""


def tokens_per_program(tokens: int, groups: int, tile_rows: int, window: int) -> int:
    """Query tokens of one row one program takes (`TOKEN_BLOCKS_ENV` on; else 1).

    Why: a program's query tile has `tile_rows` rows (at least 16, what a tensor-core dot
    takes) and one token's grouped heads fill `groups` of them: 3 of 16 for SmolLM2, 4 for
    Qwen3-4B/8B. One token per program leaves the rest as padding and reads the row's keys and
    values once per token, so a k-token verify reads the cache k times (at 4B the step grid's 32
    rows x 64 tokens over 4,096 keys took 223 ms, 19x the 32-row decode step). Filling the
    padding with the next tokens reads them once per tile, in the same tile shape as decode's. Off until
    a GPU run shows the outputs bitwise equal to one token per program (`tools/gpu`): each row's
    dot products and softmax are the same operations in the same tile shape, but that is for the
    compiled kernel to confirm. Sliding-window layers keep one token per program: their rows
    start at different keys, and a shared loop would group a row's keys differently."""
    if tokens <= 1 or window or os.environ.get(TOKEN_BLOCKS_ENV, "0") != "1":
        return 1
    return max(1, min(tokens, tile_rows // groups))


if HAVE_TRITON:

    @triton.jit(do_not_specialize=["splits"])
    def _slot_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        slots_ptr,
        pos_ptr,
        out_ptr,
        part_ptr,
        sq_b,
        sq_t,
        sq_h,
        sq_d,
        sk_s,
        sk_h,
        sk_n,
        sk_d,
        so_b,
        so_t,
        so_h,
        s_slot,
        sp_b,
        sp_t,
        T,
        blocks,
        scale,
        window,
        keys_per_split,
        splits,
        G: tl.constexpr,
        GP: tl.constexpr,
        TB: tl.constexpr,
        D: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SINGLE: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        # One program: TB consecutive query tokens of one row (TB x G query heads in the GP-row
        # tile, the rest padding) over one K/V head and one split of the keys. TB = 1 is one token.
        block = tl.program_id(0)  # b * blocks + block of TB tokens
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        b = block // blocks
        r = tl.arange(0, GP)
        t = (block % blocks) * TB + r // G  # each tile row's token
        g = r % G
        live = (r < TB * G) & (t < T)  # tile rows of real query heads
        slot = tl.load(slots_ptr + b * s_slot).to(tl.int64)
        pos = tl.load(pos_ptr + b * sp_b + t * sp_t, mask=live, other=0).to(tl.int64)  # [GP]
        # One integer type throughout: Triton rejects a variable whose type changes in a branch.
        lo = tl.where(window > 0, tl.maximum(pos - window + 1, 0), 0).to(tl.int64)
        first = (split * keys_per_split).to(tl.int64)
        stop_row = tl.minimum(pos + 1, first + keys_per_split)  # each tile row's end of keys
        # The keys any live row reads; a row masks the keys outside its own range. With TB = 1
        # every live row has the same range: the loop and masks are the one-token ones.
        start = tl.maximum(tl.min(tl.where(live, lo, tl.max(lo))), first)
        stop = tl.max(tl.where(live, stop_row, 0))

        d = tl.arange(0, D)
        heads = kv_head * G + g
        q = tl.load(
            q_ptr + b * sq_b + t[:, None] * sq_t + heads[:, None] * sq_h + d[None, :] * sq_d,
            mask=live[:, None],
            other=0.0,
        ).to(k_ptr.dtype.element_ty)
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
        acc = tl.zeros([GP, D], dtype=tl.float32)
        base = slot * sk_s + kv_head * sk_h
        for n0 in range(start, stop, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            valid = n < stop
            k = tl.load(k_ptr + base + n[:, None] * sk_n + d[None, :] * sk_d, mask=valid[:, None], other=0.0)
            v = tl.load(v_ptr + base + n[:, None] * sk_n + d[None, :] * sk_d, mask=valid[:, None], other=0.0)
            if IEEE:  # float32 caches: full-precision products (no tf32), as eager attention
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [GP, BLOCK_N]
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            own = (n[None, :] < stop_row[:, None]) & (n[None, :] >= lo[:, None])
            s = tl.where(own, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SINGLE:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(
                out_ptr + b * so_b + t[:, None] * so_t + heads[:, None] * so_h + d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=live[:, None],
            )
        else:
            # partials [rows, Hq, splits, D + 2]: acc, then m and l
            width = D + 2
            head_stride = splits * width
            row_stride = head_stride * tl.num_programs(1) * G
            p_base = part_ptr + (b * T + t) * row_stride + heads * head_stride + split * width
            tl.store(p_base[:, None] + d[None, :], acc, mask=live[:, None])
            tl.store(p_base + D, m_i, mask=live)
            tl.store(p_base + D + 1, l_i, mask=live)

    @triton.jit(do_not_specialize=["splits"])
    def _reduce_kernel(part_ptr, out_ptr, so_b, so_t, so_h, T, HQ, splits, D: tl.constexpr):
        # Merges the splits one after another, in split order, with the number of splits a
        # runtime value: every key bucket runs this same code, so a position's output does
        # not depend on how many (empty) splits its forward's key bucket had. A reduction
        # over `tl.arange(0, SPLITS)` compiled per bucket; its layout (and where fp fusion
        # put an fma) changed with SPLITS, which rounded a position that a verify chunk wrote
        # under a larger bucket than decode did differently in bf16 (on the H200, HumanEval/42's
        # first differing K/V sat at position 1022, written with 4 splits against decode's 2). Empty splits come last (keys beyond the position) or first (before a
        # sliding window) and add exactly zero.
        row = tl.program_id(0)
        head = tl.program_id(1)
        b = row // T
        t = row % T
        width = D + 2
        base = part_ptr + (row * HQ + head) * splits * width
        d = tl.arange(0, D)
        m_max = tl.load(base + D)
        for s in range(1, splits):
            m_max = tl.maximum(m_max, tl.load(base + s * width + D))
        m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
        total = tl.zeros([D], dtype=tl.float32)
        norm = tl.sum(tl.zeros([D], dtype=tl.float32), axis=0)
        for s in range(0, splits):
            m = tl.load(base + s * width + D)
            w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
            total += tl.load(base + s * width + d) * w
            norm += tl.load(base + s * width + D + 1) * w
        out = total / tl.where(norm > 0, norm, 1.0)
        tl.store(out_ptr + b * so_b + t * so_t + head * so_h + d, out.to(out_ptr.dtype.element_ty))


def slot_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    read_slots: torch.Tensor,
    positions: torch.Tensor,
    *,
    scale: float,
    key_length: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """softmax(q·kᵀ·scale) v over each row's own slot, keys [lo, position] (causal, windowed).

    query [B, Hq, T, D] (any strides); caches [slots, Hkv, L, D]; read_slots [B]; positions
    [B, T] absolute query positions (< key_length); any strides (views of the static input
    buffer). Returns [B, T, Hq, D] contiguous.
    """
    b, hq, t, d = query.shape
    hkv = k_cache.shape[1]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} K/V heads")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d} must be a power of two >= 16 for the slot-attention kernel")
    groups = hq // hkv
    splits = max(1, math.ceil(key_length / KEYS_PER_SPLIT))
    tile_rows = max(16, 1 << (groups - 1).bit_length())
    per_program = tokens_per_program(t, groups, tile_rows, int(sliding_window or 0))
    blocks = -(-t // per_program)
    out = torch.empty((b, t, hq, d), dtype=query.dtype, device=query.device)
    # Every split writes its partial (empty ones: m = -inf, l = 0), so no buffer fills.
    parts = torch.empty((b * t, hq, splits, d + 2), dtype=torch.float32, device=query.device) if splits > 1 else out
    _slot_attention_kernel[(b * blocks, hkv, splits)](
        query,
        k_cache,
        v_cache,
        read_slots,
        positions,
        out,
        parts,
        query.stride(0),
        query.stride(2),
        query.stride(1),
        query.stride(3),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.stride(3),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        read_slots.stride(0),
        positions.stride(0),
        positions.stride(1),
        t,
        blocks,
        float(scale),
        int(sliding_window or 0),
        KEYS_PER_SPLIT,
        splits,
        G=groups,
        GP=tile_rows,
        TB=per_program,
        D=d,
        BLOCK_N=64,
        SINGLE=splits == 1,
        IEEE=k_cache.dtype == torch.float32,
    )
    if splits > 1:
        _reduce_kernel[(b * t, hq)](parts, out, out.stride(0), out.stride(1), out.stride(2), t, hq, splits, D=d)
    return out


# ---------------------------------------------------------------------------------- transformers glue
ATTENTION_NAME = "selfspec_slot"
_pending = threading.local()


def set_pending(read_slots, positions, key_length: int, sliding_window: int | None, k_buffer: torch.Tensor) -> None:
    """Called by SlotKVCache.update in direct mode: what the attention call right after reads."""
    _pending.value = (read_slots, positions, key_length, sliding_window, k_buffer)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention function: slot attention when the cache handed out whole buffers.

    Otherwise (eager engine steps, `generate` on the same model) it is transformers' SDPA.
    """
    pending = getattr(_pending, "value", None)
    if pending is not None and pending[4] is key:
        _pending.value = None
        read_slots, positions, key_length, window, _ = pending
        if kwargs.get("softcap") is not None or dropout:
            raise ValueError("slot attention supports neither softcapping nor dropout")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = slot_attention(
            query, key, value, read_slots, positions, scale=scale, key_length=key_length, sliding_window=window
        )
        return out, None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def use_for(model: torch.nn.Module) -> bool:
    """Route the model's attention through `attention_forward` if it runs SDPA and the kernel
    can run on its device; True when the model now uses it."""
    device = next(model.parameters()).device
    if not available(device):
        return False
    from selfspec.engine.kv_cache import layer_kv_shapes

    head_dims = {shape[1] for shape in layer_kv_shapes(model.config) if shape is not None}
    if not head_dims or any(d < 16 or d & (d - 1) for d in head_dims):
        return False
    configs = [model.config]
    if hasattr(model.config, "get_text_config"):
        configs.append(model.config.get_text_config())
    if all(getattr(c, "_attn_implementation", None) == ATTENTION_NAME for c in configs):
        return True
    if any(getattr(c, "_attn_implementation", None) != "sdpa" for c in configs):
        return False  # eager / flash / flex: the user's choice stays
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    for c in configs:
        c._attn_implementation = ATTENTION_NAME
    return True
