"""The engine's own forward for Gated DeltaNet layers (Qwen3.5, Qwen3-Next linear attention).

Why not transformers' forward: it keeps one state per batch row and assumes every row starts
where the cache left off, so a batch of right-aligned rows of different lengths would push the
left padding through the conv and decay every padded row's state; it can neither read slots
nor keep per-position states for a verify chunk; and its cache calls changed between
transformers 5.17 and 5.24 (`cache_params.layers[i].conv_states` vs `cache.get_conv_state`).
This forward uses the module's own parameters (checkpoint names, stable across versions) and
the runner's `SlotStateCache`, and is installed per instance behind a dispatch that is active
only inside the runner's forwards: `generate` on the same model runs transformers' code.

The delta rule runs Triton kernels where `fla_kernels` says they can (CUDA, fla installed,
`SELFSPEC_FLA` not 0): for decode, verify chunks and short pieces the engine's own `slot_delta_rule`, which reads and writes each row's state in its slot (with
`SELFSPEC_SLOT_DELTA_RULE=0`, fla's fused recurrent kernel over the rows' gathered states); fla's chunked kernel for
long prefill pieces. Verify chunks then keep
their inputs and initial state, and `settle` re-runs the recurrence over the accepted prefix
(`SlotStateCache` rollback `"recompute"`). Elsewhere numerics follow transformers' torch path:
the conv over `[state | tokens]` as in `causal_conv1d_update`, the token-by-token recurrence
of `torch_recurrent_gated_delta_rule` for decode and verify chunks (every intermediate state
is kept for rollback under `"snapshots"`), and the modeling module's own
`torch_chunk_gated_delta_rule` for longer chunks (prefill pieces). The conv stays torch on
both paths (a window of K + T columns built by a gather, or for one-token rows a concatenation, and a
depthwise conv over it).

Nothing in the forward reads a device value on the host: rows, slots, padding and fresh rows come
as device tensors (`SlotStateCache` routing) and the loop lengths from shapes, so a static forward
of a fixed bucket can be captured in a CUDA graph and replayed for any step of that shape.
"""

from __future__ import annotations

import inspect
import sys
import threading
import types
from typing import Callable

import torch
import torch.nn.functional as F

from selfspec.engine import fla_kernels, slot_delta_rule
from selfspec.engine.fusion import fused_active, share_concatenated
from selfspec.engine.state_cache import LinearLayerSpec, SlotStateCache

RECURRENT_MAX_TOKENS = 1
"""Chunks up to this many tokens without snapshots run the token-by-token recurrence (decode);
longer ones the chunked kernel. Verify chunks always run the recurrence (snapshots, or the
kernel `settle` re-runs)."""

_active = threading.local()


def active_cache() -> SlotStateCache | None:
    return getattr(_active, "cache", None)


class running:
    """Context: the linear-attention layers run the engine's forward against `cache`."""

    def __init__(self, cache: SlotStateCache | None) -> None:
        self.cache = cache

    def __enter__(self) -> None:
        self._previous = active_cache()
        _active.cache = self.cache

    def __exit__(self, *exc) -> None:
        _active.cache = self._previous


def is_gated_deltanet(module: torch.nn.Module) -> bool:
    """A Gated DeltaNet mixer this forward can run: transformers' Qwen3.5 (`in_proj_qkv`,
    `in_proj_z`, `in_proj_b`, `in_proj_a`) or Qwen3-Next (`in_proj_qkvz`, `in_proj_ba`) layout."""
    common = all(hasattr(module, n) for n in ("conv1d", "A_log", "dt_bias", "norm", "out_proj", "layer_idx"))
    qwen35 = all(hasattr(module, n) for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
    qwen3_next = hasattr(module, "in_proj_qkvz") and hasattr(module, "in_proj_ba")
    return common and (qwen35 or qwen3_next)


def layer_spec(module: torch.nn.Module) -> LinearLayerSpec:
    return LinearLayerSpec(
        conv_dim=int(module.conv_dim),
        kernel=int(module.conv_kernel_size),
        heads=int(module.num_v_heads),
        k_dim=int(module.head_k_dim),
        v_dim=int(module.head_v_dim),
    )


def install(model: torch.nn.Module) -> dict[int, LinearLayerSpec]:
    """Give every Gated DeltaNet layer of `model` the dispatching forward; return their specs
    by layer index. Idempotent (shallow drafts share their layers with the target).

    The forward is a bound method, so a deep copy of a layer (a distilled draft, an arbitrator)
    dispatches on the copy's own weights."""
    specs: dict[int, LinearLayerSpec] = {}
    for module in model.modules():
        if not is_gated_deltanet(module):
            continue
        specs[int(module.layer_idx)] = layer_spec(module)
        if getattr(module.forward, "__func__", None) is not _dispatching_forward:
            module.forward = types.MethodType(_dispatching_forward, module)
    return specs


def _dispatching_forward(self: torch.nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
    """The engine's forward inside a runner's step, transformers' class forward otherwise."""
    cache = active_cache()
    if cache is None or cache.routing is None:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    return slot_forward(self, hidden_states, cache)


def _input_projections(module) -> list[torch.nn.Linear]:
    """The layer's projections of its input, in the order the forward uses their outputs."""
    if hasattr(module, "in_proj_qkvz"):
        return [module.in_proj_qkvz, module.in_proj_ba]
    return [module.in_proj_qkv, module.in_proj_z, module.in_proj_b, module.in_proj_a]


def _projected(module, hidden_states: torch.Tensor) -> list[torch.Tensor]:
    """Each input projection's output: inside the engine's fused forwards one GEMM over the
    concatenated weights (`fuse_layers`; the skinny-GEMM table's kernel where it routed it), split
    by output rows; otherwise each linear on its own."""
    weight = getattr(module, "_fused_gdn_in_weight", None)
    if weight is None or not fused_active():
        return [linear(hidden_states) for linear in _input_projections(module)]
    linear = getattr(module, "_selfspec_linear", F.linear)
    return list(linear(hidden_states, weight, module._fused_gdn_in_bias).split(module._gdn_in_sizes, dim=-1))


def _projections(module, hidden_states: torch.Tensor):
    """mixed q|k|v [B, T, C], z [B, T, H, V], b and a [B, T, H], as the module's forward has them."""
    batch, seq_len, _ = hidden_states.shape
    outputs = _projected(module, hidden_states)
    if hasattr(module, "in_proj_qkvz"):
        query, key, value, z, b, a = module.fix_query_key_value_ordering(*outputs)
        query, key, value = (x.reshape(x.shape[0], x.shape[1], -1) for x in (query, key, value))
        return torch.cat((query, key, value), dim=-1), z, b, a
    mixed, z, b, a = outputs
    return mixed, z.reshape(batch, seq_len, -1, module.head_v_dim), b, a


def _conv_window(state: torch.Tensor, mixed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """[zeros(pad) | state | real tokens] per row, [B, C, K + T], from state [B, C, K] and the
    right-aligned tokens [B, C, T]: the padding moves in front of the state, so each row's real
    tokens follow their own history. Column c of the window holds, for c < pad, zero; for
    pad <= c < pad + K, state[c - pad]; beyond, token c - K."""
    batch, channels, kernel = state.shape
    tokens = mixed.shape[-1]
    if tokens == 1:
        # Decode-shaped forwards: a row's one column is real (pad 0, the window is [state | token])
        # or the row is a bucket's padding, whose outputs and state go to the scratch slot. A
        # concatenation then gives every real row the same window as the gather below, without its
        # indirect loads (compiled, the gather cost ~15 us a layer at 32 rows on an H100).
        return torch.cat([state.to(mixed.dtype), mixed], dim=-1)
    pad = (~real).sum(dim=1, keepdim=True)  # [B, 1]
    col = torch.arange(kernel + tokens, device=mixed.device).unsqueeze(0)  # [1, K + T]
    combined = torch.cat([state.to(mixed.dtype), mixed], dim=-1)  # state then tokens (pads first)
    in_state = (col >= pad) & (col < pad + kernel)
    source = torch.where(in_state, col - pad, col).clamp(max=kernel + tokens - 1)
    window = combined.gather(2, source.unsqueeze(1).expand(batch, channels, -1))
    return window.masked_fill((col < pad).unsqueeze(1), 0)


def depthwise_conv_tail(
    window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, outputs: int
) -> torch.Tensor:
    """The last `outputs` columns of `F.conv1d(window, weight[:, None], bias, groups=C)`, [B, C, outputs].

    Why not conv1d: compiled (`fuse_layers`), a sum over the few taps (4 in Qwen3.5 and Qwen3-Next)
    fuses into the kernel that builds the window and applies the activation, where a convolution
    stays a kernel of its own each layer and step. The taps are summed in fp32, as the convolution
    accumulates, and the result is rounded once to the weight's dtype.
    """
    taps = weight.shape[-1]
    if taps > 8:
        full = F.conv1d(window, weight.unsqueeze(1), bias, groups=weight.shape[0])
        return full[:, :, -outputs:]
    start = window.shape[-1] - taps + 1 - outputs
    acc = window[:, :, start : start + outputs].float() * weight[:, :1].float()
    for k in range(1, taps):
        acc = acc + window[:, :, start + k : start + k + outputs].float() * weight[:, k : k + 1].float()
    if bias is not None:
        acc = acc + bias.float().unsqueeze(-1)
    return acc.to(weight.dtype)


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in ("silu", "swish"):
        return F.silu
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_rule(query, key, value, g, beta, initial_state, keep_states: bool):
    """transformers' `torch_recurrent_gated_delta_rule` (same operations, so a decode step has
    the same numerics), returning the state after every token when `keep_states`.

    Shapes in: query/key [B, T, Hk, Dk], value [B, T, H, Dv], g/beta [B, T, H], state [B, H, Dk, Dv].
    Returns (out [B, T, H, Dv], final state, [S_0, ..., S_T] or None).
    """
    initial_dtype = query.dtype
    query, key = value_heads(query, key, value)
    query, key, value, beta, decay = [
        x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format) for x in (query, key, value, beta, g)
    ]
    query = _l2norm(query)
    key = _l2norm(key)
    query = query / (query.shape[-1] ** 0.5)
    state = initial_state.to(value)
    states = [state] if keep_states else None
    out = torch.zeros_like(value)
    for i in range(value.shape[2]):
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * decay[:, :, i].exp()[..., None, None]
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
        if states is not None:
            states.append(state)
    return out.transpose(1, 2).contiguous().to(initial_dtype), state, states


def value_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key heads repeated up to the value heads (Qwen3.5-4B: 16 key, 32 value heads).
    transformers 5.24 does this inside its torch delta rules, 5.17 (the GPU machine's) does not,
    so the engine does it before calling them."""
    num_k_heads, num_v_heads = key.shape[2], value.shape[2]
    if num_k_heads == num_v_heads:
        return query, key
    return query.repeat_interleave(num_v_heads // num_k_heads, dim=2), key.repeat_interleave(
        num_v_heads // num_k_heads, dim=2
    )


def _chunk_rule(module) -> Callable:
    """The modeling module's chunked delta rule, transformers' torch path. Unwrapped: where fla
    is installed, transformers wraps it to dispatch CUDA inputs to fla, and the engine's torch
    path (fla off or unusable, `fla_kernels`) must stay torch."""
    modeling = sys.modules.get(type(module).__module__)
    rule = getattr(modeling, "torch_chunk_gated_delta_rule", None)
    if rule is None:
        raise RuntimeError(f"{type(module).__module__} has no torch_chunk_gated_delta_rule")
    return inspect.unwrap(rule)


def prepare_chunk(
    mixed: torch.Tensor,
    conv_cache: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
    real: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    split: tuple[int, int, int],
    head_dims: tuple[int, int, int],
    activation: str,
):
    """Everything between the input projections and the delta rule, as pure tensor code: the
    causal conv over [state | tokens] per row (`_conv_window`), its activation, the split into
    queries, keys and values [B, T, heads, dim], and the decay g and learning rate beta [B, T, H]
    with padding columns neutral (g = 0: decay 1; beta = 0: no write). Returns (window, conv_out
    [B, T, C], query, key, value, g, beta). Pure so that `fuse_layers` can compile it: eager it is
    some forty small kernels per layer and step (on an H100, Qwen3.5-4B's decode step ran 834
    pointwise and 502 copy kernels, a third of its 7 ms)."""
    batch, seq_len, _ = mixed.shape
    # The rows' conv states read here, not by the caller: compiled, the read joins the window's kernel.
    conv_state = conv_cache.index_select(0, slots).masked_fill(fresh.view(-1, 1, 1), 0)
    window = _conv_window(conv_state, mixed.transpose(1, 2), real)
    weight = conv_weight.squeeze(1)
    conv_out = depthwise_conv_tail(window.to(weight.dtype), weight, conv_bias, seq_len)
    conv_out = _activation(activation)(conv_out).to(mixed.dtype).transpose(1, 2)
    # Contiguous here, where compiled they come out of the fused kernel: fla's kernels would copy a
    # strided view of the conv output (three copy kernels per layer and step).
    query, key, value = (
        part.reshape(batch, seq_len, -1, dim).contiguous()
        for part, dim in zip(torch.split(conv_out, list(split), dim=-1), head_dims)
    )
    beta = b.sigmoid()
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias)
    # Padding columns leave the state as it is: decay exp(0) = 1, learning rate 0.
    pad_cols = (~real).unsqueeze(-1)
    return window, conv_out, query, key, value, g.masked_fill(pad_cols, 0), beta.masked_fill(pad_cols, 0)


def fuse_layers(model: torch.nn.Module, backend: str = "inductor") -> list[str]:
    """Inside the engine's fused forwards (`fusion.fused`), run each Gated DeltaNet layer's input
    projections as one GEMM over their concatenated weights (the linears keep views of it) and
    `prepare_chunk` compiled; its gated norm is compiled with the other norms
    (`fusion.compile_pointwise_modules`). Returns what was fused, for reports. Idempotent."""
    prepare = None
    fused: set[str] = set()
    for module in model.modules():
        if not is_gated_deltanet(module) or hasattr(module, "_fused_gdn_in_weight"):
            continue
        linears = _input_projections(module)
        share_concatenated(module, "gdn_in", linears)
        module._gdn_in_sizes = [int(linear.weight.shape[0]) for linear in linears]
        if prepare is None:
            prepare = torch.compile(prepare_chunk, dynamic=True, backend=backend)
        module._selfspec_gdn_prepare = prepare
        fused.add(f"{type(module).__name__}.in_proj+prepare")
    return sorted(fused)


def slot_forward(module, hidden_states: torch.Tensor, cache: SlotStateCache) -> torch.Tensor:
    """The layer over a routed step: read each row's slot state, run, write the new state back
    and keep what rollback needs (`SlotStateCache.write`)."""
    routing = cache.routing
    batch, seq_len, _ = hidden_states.shape
    layer = int(module.layer_idx)
    real = routing.real
    mixed, z, b, a = _projections(module, hidden_states)
    keep_states = routing.snapshots and cache.rollback == "snapshots"
    # Decode, verify chunks and short pieces on a GPU: the rule reads and writes the slots' states
    # in place (`slot_delta_rule`), with no gather of the states before nor scatter after.
    in_slots = (
        not keep_states
        and (routing.snapshots or seq_len < fla_kernels.CHUNK_MIN_TOKENS)
        and slot_delta_rule.applies(hidden_states.device, hidden_states.dtype)
    )
    rec_state = None if in_slots else cache.read_recurrent(layer)
    prepare = getattr(module, "_selfspec_gdn_prepare", None) if fused_active() else None
    window, conv_out, query, key, value, g, beta = (prepare or prepare_chunk)(
        mixed,
        cache.conv[layer],
        routing.slots,
        routing.fresh,
        real,
        module.conv1d.weight,
        module.conv1d.bias,
        a,
        b,
        module.A_log,
        module.dt_bias,
        (module.key_dim, module.key_dim, module.value_dim),
        (module.head_k_dim, module.head_k_dim, module.head_v_dim),
        module.activation,
    )
    states = None
    if in_slots:
        core, rec_state = slot_delta_rule.run(
            query, key, value, g, beta, cache.recurrent[layer], routing.slots, routing.fresh, routing.snapshots
        )
        final = None  # written into the slots by the kernel
    elif keep_states:
        core, final, states = recurrent_rule(query, key, value, g, beta, rec_state, True)
    elif fla_kernels.applies(query.device, query.dtype):
        if routing.snapshots or seq_len < fla_kernels.CHUNK_MIN_TOKENS:
            # Verify chunks always run the kernel that `settle` re-runs over the accepted prefix.
            core, final = fla_kernels.recurrent(query, key, value, g, beta, rec_state)
        else:
            core, final = fla_kernels.chunked(query, key, value, g, beta, rec_state)
    elif routing.snapshots or seq_len <= RECURRENT_MAX_TOKENS:
        core, final, _ = recurrent_rule(query, key, value, g, beta, rec_state, False)
    else:
        core, final = _chunk_rule(module)(
            *value_heads(query, key, value),
            value,
            g=g,
            beta=beta,
            initial_state=rec_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
    inputs = None
    if routing.snapshots and not keep_states:  # rollback by recompute: the chunk's inputs
        inputs = (conv_out, g, beta, rec_state)
    cache.write(layer, window, states, final, inputs)
    core = module.norm(core.reshape(-1, module.head_v_dim), z.reshape(-1, module.head_v_dim))
    return module.out_proj(core.reshape(batch, seq_len, -1))
