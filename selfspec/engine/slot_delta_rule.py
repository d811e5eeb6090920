"""The gated delta rule reading and writing each row's state in its cache slot, in one launch.

Why: the engine keeps every request's recurrent state in a slot of one tensor per layer
([slots, heads, key dim, value dim], fp32, 2 MiB per slot on Qwen3.5-4B). With fla's kernel a
step gathered the rows' states (`index_select`), zeroed the fresh rows' (`masked_fill`), ran the
kernel into a new final-state tensor and scattered it back (`index_copy_`): three extra passes
over every state and three launches per layer, 0.48 ms of a 4.0 ms batch-1 step on an H200 and
1.2 ms of a batch-8 one (`benchmarks/engine_speed/README.md`). Here each program loads its tile
of the row's state from the slot, runs the row's tokens and stores the tile back in place, and,
for a verify whose rollback recomputes from the chunk's initial state, also stores that initial
state (row-indexed) on the way in.

Per head, token by token (the order of transformers' `torch_recurrent_gated_delta_rule` and
of fla's fused recurrent kernel): q and k L2-normalised, q scaled by 1/sqrt(key dim);
S <- S * exp(g); v' <- (v - S^T k) * beta; S <- S + k v'^T; out <- S^T q. Grouped heads (fewer
query/key heads than value heads) share a query/key head as in `recurrent_rule`.

Where it applies (`applies`, switched off by `ENV_SWITCH`), every recurrent use of the rule on a GPU goes through this
kernel (decode, short prefill chunks, verifies and `SlotStateCache.settle`'s recompute), so a state
recomputed at a settle is the state a decode would have reached, bit for bit. Long prefill chunks keep fla's chunked form.
Tested against `recurrent_rule` under Triton's interpreter on the CPU
(`tests/engine/test_slot_delta_rule.py`) and on the GPU by `tools/gpu/gpu_fla_check.py`.
"""

from __future__ import annotations

import os

import torch

from selfspec.engine import fla_kernels

try:  # Triton ships with CUDA builds of torch; a CPU-only install runs the torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton
    triton = None
    tl = None

ENV_SWITCH = "SELFSPEC_SLOT_DELTA_RULE"
"""On by default wherever fla's recurrent kernel would run; set to 0 to run fla's fused recurrent
kernel over gathered states instead. Checked on an H100 (`tools/gpu/queues/slot_rule.txt`): alone
in fp32 at Qwen3.5-4B's dims within 1.7e-6 of `recurrent_rule`, a bf16 layer within the same
bound as fla's, and the engine 8.6% faster at batch 1 and 25% at batch 8 than with the gather
(`benchmarks/engine_speed/README.md`); its graphs take about 30 s longer to capture."""

PREFETCH_SWITCH = "SELFSPEC_SLOT_RULE_PREFETCH"
PREFETCH = os.environ.get(PREFETCH_SWITCH, "1") != "0"
"""On by default (`SELFSPEC_SLOT_RULE_PREFETCH`, read at import): each token's inputs are loaded
while the previous token computes (the same arithmetic in the same order; on an H100 the same bits,
0.76x the time at 32 tokens, `benchmarks/decode_kernels.py`); `0` runs the loop that loads each
token's inputs when it starts, to time the two against each other. Decode, verify and a settle's
recompute run the same loop in one process, so a settled state is still a decode's."""

BLOCK_V = 32
"""Value columns per program: a [key dim x 32] fp32 tile of the state in registers (16 KB at key
dim 128), and heads x value dim / 32 programs per row (128 per row on Qwen3.5-4B)."""


def applies(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """Whether the engine runs this kernel: wherever it would run fla's recurrent one
    (`fla_kernels.applies`: CUDA, fla usable, not float32), unless `SELFSPEC_SLOT_DELTA_RULE=0`."""
    return triton is not None and os.environ.get(ENV_SWITCH, "1") != "0" and fla_kernels.applies(device, dtype)


if triton is not None:

    @triton.jit
    def _load_token(p_q, p_k, p_v, p_g, p_beta, mask_k, mask_v):
        """One token's q, k (key block), v (value block), g and beta, in fp32."""
        b_q = tl.load(p_q, mask=mask_k, other=0.0).to(tl.float32)
        b_k = tl.load(p_k, mask=mask_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=mask_v, other=0.0).to(tl.float32)
        return b_q, b_k, b_v, tl.load(p_g).to(tl.float32), tl.load(p_beta).to(tl.float32)

    @triton.jit
    def _delta_step(b_h, b_q, b_k, b_v, b_g, b_beta, scale):
        """One token of the rule on a [key dim, value block] tile: (new state, output block)."""
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6) * scale
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_h *= tl.exp(b_g)
        b_v -= tl.sum(b_h * b_k[:, None], 0)
        b_v *= b_beta
        b_h += b_k[:, None] * b_v[None, :]
        return b_h, tl.sum(b_h * b_q[:, None], 0)

    @triton.jit(do_not_specialize=["T"])
    def _slot_delta_rule_kernel(
        q,
        k,
        v,
        g,
        beta,
        out,
        states,
        slots,
        fresh,
        initial,
        scale,
        T,
        slot_stride,
        H: tl.constexpr,
        HV: tl.constexpr,
        K: tl.constexpr,
        V: tl.constexpr,
        BK: tl.constexpr,
        BV: tl.constexpr,
        KEEP_INITIAL: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        i_v = tl.program_id(0)
        i_nh = tl.program_id(1).to(tl.int64)
        i_n, i_hv = i_nh // HV, i_nh % HV
        i_h = i_hv // (HV // H)
        slot = tl.load(slots + i_n * slot_stride).to(tl.int64)  # a static forward's slots are a strided view
        is_fresh = tl.load(fresh + i_n)

        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        mask_k = o_k < K
        mask_v = o_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        tile = o_k[:, None] * V + o_v[None, :]

        p_state = states + (slot * HV + i_hv) * K * V + tile
        b_h = tl.load(p_state, mask=mask_h, other=0.0).to(tl.float32)
        b_h = tl.where(is_fresh != 0, 0.0, b_h)  # `where`, not a product: a fresh slot may hold NaN
        if KEEP_INITIAL:
            tl.store(initial + i_nh * K * V + tile, b_h, mask=mask_h)

        p_q = q + (i_n * T * H + i_h) * K + o_k
        p_k = k + (i_n * T * H + i_h) * K + o_k
        p_v = v + (i_n * T * HV + i_hv) * V + o_v
        p_o = out + (i_n * T * HV + i_hv) * V + o_v
        p_g = g + i_n * T * HV + i_hv
        p_beta = beta + i_n * T * HV + i_hv
        if PREFETCH:
            # Token t's inputs are loaded during token t - 1's arithmetic: a verify or a short
            # prefill chunk runs its tokens one after another in one program, and without the
            # prefetch each step would wait out a global-memory round trip before its first multiply.
            n_q, n_k, n_v, n_g, n_beta = _load_token(p_q, p_k, p_v, p_g, p_beta, mask_k, mask_v)
            for t in tl.range(0, T):
                b_q, b_k, b_v, b_g, b_beta = n_q, n_k, n_v, n_g, n_beta
                more = tl.where(t + 1 < T, 1, 0)  # the last token re-reads itself: no load out of range
                p_q += more * H * K
                p_k += more * H * K
                p_v += more * HV * V
                p_g += more * HV
                p_beta += more * HV
                n_q, n_k, n_v, n_g, n_beta = _load_token(p_q, p_k, p_v, p_g, p_beta, mask_k, mask_v)
                b_h, b_o = _delta_step(b_h, b_q, b_k, b_v, b_g, b_beta, scale)
                tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
                p_o += HV * V
        else:
            for _ in tl.range(0, T):
                b_q, b_k, b_v, b_g, b_beta = _load_token(p_q, p_k, p_v, p_g, p_beta, mask_k, mask_v)
                b_h, b_o = _delta_step(b_h, b_q, b_k, b_v, b_g, b_beta, scale)
                tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
                p_q += H * K
                p_k += H * K
                p_v += HV * V
                p_o += HV * V
                p_g += HV
                p_beta += HV
        tl.store(p_state, b_h, mask=mask_h)


def run(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
    keep_initial: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rule over each row's tokens from (and back into) its slot's state.

    query/key [B, T, Hk, Dk], value [B, T, H, Dv], g/beta [B, T, H] (padding columns neutral:
    g = 0, beta = 0), states [S, H, Dk, Dv] fp32 (updated in place), slots [B] (the rows'
    slots), fresh [B] bool (rows whose initial state is zero, whatever the slot holds). Returns
    (out [B, T, H, Dv] in the values' dtype, the rows' initial states [B, H, Dk, Dv] fp32 when
    `keep_initial`, else None)."""
    batch, seq_len, heads_k, dim_k = key.shape
    heads_v, dim_v = value.shape[2], value.shape[3]
    if states.dtype != torch.float32 or not states.is_contiguous():
        raise ValueError("slot states must be a contiguous float32 tensor")
    if heads_v % heads_k:
        raise ValueError(f"{heads_v} value heads are not a multiple of {heads_k} key heads")
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    g, beta = g.contiguous(), beta.contiguous()
    fresh = fresh.contiguous()
    out = torch.empty_like(value)
    initial = (
        torch.empty(batch, heads_v, dim_k, dim_v, device=value.device, dtype=torch.float32) if keep_initial else None
    )
    block_v = min(BLOCK_V, triton.next_power_of_2(dim_v))
    grid = (triton.cdiv(dim_v, block_v), batch * heads_v)
    _slot_delta_rule_kernel[grid](
        query,
        key,
        value,
        g,
        beta,
        out,
        states,
        slots,
        fresh,
        initial if initial is not None else out,  # unused without KEEP_INITIAL
        dim_k**-0.5,
        seq_len,
        slots.stride(0),
        H=heads_k,
        HV=heads_v,
        K=dim_k,
        V=dim_v,
        BK=triton.next_power_of_2(dim_k),
        BV=block_v,
        KEEP_INITIAL=keep_initial,
        PREFETCH=PREFETCH,
    )
    return out, initial


def recurrent(query, key, value, g, beta, initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`run` from given initial states [B, H, Dk, Dv] (copied, not changed): (out, final states).
    What `SlotStateCache.settle` recomputes with, so a settled state is a decode's, bit for bit."""
    states = initial_state.to(torch.float32).clone(memory_format=torch.contiguous_format)
    rows = torch.arange(states.shape[0], device=states.device)
    fresh = torch.zeros(states.shape[0], dtype=torch.bool, device=states.device)
    out, _ = run(query, key, value, g, beta, states, rows, fresh)
    return out, states
