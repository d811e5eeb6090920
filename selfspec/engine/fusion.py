"""Fused pointwise pieces for the engine's forwards: torch.compile on norms, MLPs and rotary
(and, in `residual_fusion`, each residual add with the norm after it).

Why: once a step is a CUDA graph replay, its cost is roughly the number of kernels. An
eager RMSNorm is ~7 kernels (casts, pow, mean, rsqrt, two muls), rotary ~10, the MLP's
activation-times-up 2; inductor fuses each into one. GEMMs and attention stay as they are.

Only these small, cache-free functions are compiled (with dynamic shapes, so one
compilation serves every bucket), not the whole model: the slot cache's Python routing and
transformers' mask plumbing stay eager, where they are cheap because they only run while a
graph is captured.

The model object stays usable by other code (e.g. `generate` as a baseline in the same
process): the compiled versions are used only inside `fused()`, which the engine's runner
enters around its own forwards.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
from typing import Callable, Iterator

import torch

_state = threading.local()

POINTWISE_SUFFIXES = ("RMSNorm", "RMSNormGated", "MLP")


def fused_active() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def fused() -> Iterator[None]:
    """Use the compiled pieces (where a model has them) for forwards in this block."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def _dispatch(eager: Callable, compiled: Callable) -> Callable:
    def forward(*args, **kwargs):
        if fused_active():
            return compiled(*args, **kwargs)
        return eager(*args, **kwargs)

    forward.__wrapped__ = eager  # type: ignore[attr-defined]
    forward._selfspec_fused = True  # type: ignore[attr-defined]
    return forward


DETERMINISM_ENV = "SELFSPEC_INDUCTOR_DETERMINISTIC"

LAYER_REWRITES_ENV = "SELFSPEC_LAYER_REWRITES"
"""`0` keeps transformers' layer and attention forwards as they are: no residual add fused into
its norm (`residual_fusion`), no q/k norm inside the rotary (`qk_norm_rope`); for an A/B in one run."""


INDUCTOR_DETERMINISM_FLAGS = ("deterministic", "batch_invariant")
"""Inductor config flags `deterministic_inductor` sets where this torch has them."""


def deterministic_inductor() -> dict[str, bool]:
    """Ask inductor for kernels whose numerics do not depend on timing or on the batch.

    Why: by default inductor autotunes its reduction kernels (the RMSNorms compiled here)
    over configs with different block sizes and warp counts, picking the fastest *measured*
    on the first call — and those configs sum in different orders, so a decode step (one
    token; dynamo specialises sizes of 1) and a verify step could round a row differently,
    per process. Measured on the H200 with torch 2.11, decode and verify logits are bitwise
    equal with the mode on and off; it stays on because it costs nothing measurable and rules
    the mechanism out on other torch versions and GPUs. `batch_invariant` (newer torch) also keeps a row's kernel the same for
    every batch size. `SELFSPEC_INDUCTOR_DETERMINISTIC=0` leaves inductor alone (diagnostics).
    Returns the settings applied (empty when none).
    """
    if os.environ.get(DETERMINISM_ENV, "1").strip() == "0":
        return {}
    import torch._inductor.config as inductor_config

    applied: dict[str, bool] = {}
    for name in INDUCTOR_DETERMINISM_FLAGS:
        if hasattr(inductor_config, name):
            setattr(inductor_config, name, True)
            applied[name] = True
    return applied


def inductor_modes() -> dict[str, bool | None]:
    """The determinism flags as inductor has them now (None: not in this torch), for records."""
    import torch._inductor.config as inductor_config

    return {name: getattr(inductor_config, name, None) for name in INDUCTOR_DETERMINISM_FLAGS}


def compile_pointwise_modules(model: torch.nn.Module, backend: str = "inductor") -> list[str]:
    """Give the model's norm and MLP modules, and its rotary function, compiled twins.

    Returns what was wrapped (class or function names), for reports. Idempotent. Inductor is
    put in its deterministic mode first (`deterministic_inductor`).
    """
    deterministic_inductor()
    # One compiled entry serves all instances of a class (parameters are graph inputs);
    # the limit only matters if a model mixes many norm variants.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    wrapped: set[str] = set()
    compiled_by_class: dict = {}
    for module in model.modules():
        if _fuse_qkv(module):
            wrapped.add(f"{type(module).__name__}.qkv")
    for module in model.modules():
        cls = type(module)
        if _has_gate_up(module) and not getattr(module.forward, "_selfspec_fused", False):
            share_concatenated(module, "gate_up", [module.gate_proj, module.up_proj])
            compiled = compiled_by_class.get(("gate_up", cls))
            if compiled is None:
                compiled = torch.compile(_gate_up_mlp, dynamic=True, backend=backend)
                compiled_by_class[("gate_up", cls)] = compiled
            eager = module.forward
            module.forward = _dispatch(eager, lambda x, _m=module, _c=compiled: _c(_m, x))
            wrapped.add(f"{cls.__name__}.gate_up")
            continue
        if not cls.__name__.endswith(POINTWISE_SUFFIXES):
            continue
        if getattr(module.forward, "_selfspec_fused", False):
            continue
        compiled = compiled_by_class.get(cls)
        if compiled is None:
            compiled = torch.compile(cls.forward, dynamic=True, backend=backend)
            compiled_by_class[cls] = compiled
        eager = module.forward
        module.forward = _dispatch(eager, lambda *a, _m=module, _c=compiled, **k: _c(_m, *a, **k))
        wrapped.add(cls.__name__)
    from selfspec.engine.linear_attention import fuse_layers  # that module imports this one

    wrapped.update(fuse_layers(model, backend=backend))
    if os.environ.get(LAYER_REWRITES_ENV, "1").strip() != "0":
        from selfspec.engine.qk_norm_rope import fuse_qk_norm_rope  # these modules import this one
        from selfspec.engine.residual_fusion import fuse_residual_norms

        wrapped.update(fuse_residual_norms(model, backend=backend))
        wrapped.update(fuse_qk_norm_rope(model, backend=backend))
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            modeling = sys.modules.get(type(module).__module__)
            rotary = getattr(modeling, "apply_rotary_pos_emb", None)
            if rotary is not None and not getattr(rotary, "_selfspec_fused", False):
                setattr(
                    modeling,
                    "apply_rotary_pos_emb",
                    _dispatch(rotary, torch.compile(rotary, dynamic=True, backend=backend)),
                )
                wrapped.add(f"{modeling.__name__}.apply_rotary_pos_emb")
    return sorted(wrapped)


_INSTANCE_OVERRIDES = (
    "forward",
    "_selfspec_linear",
    "_selfspec_skinny",
    "_selfspec_gdn_prepare",
    "_gdn_in_sizes",
    "_selfspec_pending_aware",
)
"""What the fusion passes set on module instances: forward overrides, the skinny-GEMM table's
bound `linear` (the table holds a lock and its kernels: not copyable) and its flag, a Gated
DeltaNet layer's compiled preparation and its fused projection's split, the flag of a norm
that takes a residual sum's norm from the layer before (`residual_fusion`)."""


def unfused_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of (part of) a possibly fused model that runs its own weights eagerly.

    Why not `copy.deepcopy` alone: on a GPU the skinny-GEMM pass stores the kernel table's
    bound method on attention modules, and the table holds a lock, so a plain deep copy of a
    fused model raises. The instance overrides are passed through by reference (the memo) and
    then removed from the copy by `strip_fusion`, so nothing of the original's fusion is
    copied or shared; the copy can be fused again on its own.
    """
    memo: dict[int, object] = {}
    for sub in module.modules():
        for name in _INSTANCE_OVERRIDES:
            if name in sub.__dict__:
                memo[id(sub.__dict__[name])] = sub.__dict__[name]
    copied = copy.deepcopy(module, memo)
    strip_fusion(copied)
    return copied


def strip_fusion(module: torch.nn.Module) -> None:
    """Undo `compile_pointwise_modules` on a deep copy of (part of) a fused model.

    The instance `forward` overrides are closures over the *original* modules (deepcopy copies
    functions by reference), so a copy would run the original's weights; the `_fused_*`
    buffers are stale copies. Afterwards the class forwards run the copy's own weights
    (the distilled draft's layer copies, the arbitrator's backbone).
    """
    for sub in module.modules():
        for name in _INSTANCE_OVERRIDES:
            sub.__dict__.pop(name, None)
        for name in [n for n in sub._buffers if n.startswith("_fused_")]:
            del sub._buffers[name]
            sub._non_persistent_buffers_set.discard(name)


# ---------------------------------------------------------------------------------- projections
def share_concatenated(owner: torch.nn.Module, name: str, linears: list[torch.nn.Linear]) -> None:
    """Concatenate the linears' weights into `owner._fused_<name>` and make each weight a view.

    One GEMM then computes all outputs; the views keep the eager path (and memory) as before.
    """
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0).contiguous()
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[start : start + rows], requires_grad=False)
        start += rows
    owner.register_buffer(f"_fused_{name}_weight", weight, persistent=False)
    if any(lin.bias is not None for lin in linears):
        bias = torch.cat(
            [
                lin.bias.detach()
                if lin.bias is not None
                else torch.zeros(lin.weight.shape[0], dtype=weight.dtype, device=weight.device)
                for lin in linears
            ]
        )
        owner.register_buffer(f"_fused_{name}_bias", bias, persistent=False)
    else:
        owner.register_buffer(f"_fused_{name}_bias", None, persistent=False)


def _has_gate_up(module: torch.nn.Module) -> bool:
    parts = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return (
        all(isinstance(p, torch.nn.Linear) for p in parts)
        and hasattr(module, "act_fn")
        and parts[0].bias is None
        and parts[1].bias is None
        and parts[0].weight.shape == parts[1].weight.shape
    )


def _gate_up_mlp(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(act(gate(x)) * up(x)) with gate and up as one GEMM (the Llama/Qwen/Gemma MLP)."""
    gate, up = torch.nn.functional.linear(x, module._fused_gate_up_weight).chunk(2, dim=-1)
    return module.down_proj(module.act_fn(gate) * up)


def _fuse_qkv(attn: torch.nn.Module) -> bool:
    """One GEMM for q, k and v: the q projection computes all three, k and v hand theirs out.

    transformers' attention modules call q_proj, k_proj and v_proj on the same hidden states,
    in that order; k/v fall back to their own (view) weights if a model does otherwise.
    """
    projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if not all(isinstance(p, torch.nn.Linear) for p in projs) or getattr(projs[0].forward, "_selfspec_fused", False):
        return False
    share_concatenated(attn, "qkv", projs)
    sizes = [p.weight.shape[0] for p in projs]
    pending: dict = {}

    def fused_q(x: torch.Tensor) -> torch.Tensor:
        linear = getattr(attn, "_selfspec_linear", torch.nn.functional.linear)
        q, k, v = linear(x, attn._fused_qkv_weight, attn._fused_qkv_bias).split(sizes, dim=-1)
        pending["x"], pending["k"], pending["v"] = x, k, v
        return q

    def fused_part(name: str, proj: torch.nn.Linear) -> Callable:
        def forward(x: torch.Tensor) -> torch.Tensor:
            if pending.get("x") is x and name in pending:
                return pending.pop(name)
            return torch.nn.functional.linear(x, proj.weight, proj.bias)

        return forward

    projs[0].forward = _dispatch(projs[0].forward, fused_q)
    projs[1].forward = _dispatch(projs[1].forward, fused_part("k", projs[1]))
    projs[2].forward = _dispatch(projs[2].forward, fused_part("v", projs[2]))
    return True


# ---------------------------------------------------------------------------------- skinny GEMMs
def _act_mul(module: torch.nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return module.act_fn(gate) * up


def use_skinny_gemms(model: torch.nn.Module, table, backend: str = "inductor") -> list[str]:
    """Inside `fused()`, run the decoder's projections and the LM head through `table.linear`.

    `table` is an `engine.skinny_gemm.SkinnyGemmTable`: per weight shape it measured whether
    its kernel or cuBLAS is faster (`select`), so a shape where cuBLAS wins keeps cuBLAS. Call
    after `compile_pointwise_modules` (it reuses the fused q/k/v and gate/up weights). The MLP
    becomes GEMM, compiled activation-times-up, GEMM: the same kernels as its compiled twin,
    with the GEMMs outside the compiled region where the table can pick them. Returns what
    was rerouted, for reports.
    """
    wrapped: set[str] = set()
    act_mul = torch.compile(_act_mul, dynamic=True, backend=backend)
    for module in model.modules():
        qkv = getattr(module, "_fused_qkv_weight", None)
        if qkv is not None and not hasattr(module, "_selfspec_linear"):
            table.select(qkv, getattr(module, "_fused_qkv_bias", None))
            module._selfspec_linear = table.linear
            wrapped.add(f"{type(module).__name__}.qkv")
        out_proj = getattr(module, "o_proj", None)
        if qkv is not None and isinstance(out_proj, torch.nn.Linear):
            _route_linear(out_proj, table)
            wrapped.add(f"{type(module).__name__}.o_proj")
        gdn_in = getattr(module, "_fused_gdn_in_weight", None)
        if gdn_in is not None and not hasattr(module, "_selfspec_linear"):
            # A Gated DeltaNet layer (`linear_attention.fuse_layers`): its input projections as one.
            table.select(gdn_in, getattr(module, "_fused_gdn_in_bias", None))
            module._selfspec_linear = table.linear
            _route_linear(module.out_proj, table)
            wrapped.add(f"{type(module).__name__}.in_proj+out_proj")
        gate_up = getattr(module, "_fused_gate_up_weight", None)
        if gate_up is not None and not getattr(module, "_selfspec_skinny", False):
            table.select(gate_up)
            table.select(module.down_proj.weight, module.down_proj.bias)
            eager = getattr(module.forward, "__wrapped__", module.forward)

            def skinny_mlp(x: torch.Tensor, _m=module) -> torch.Tensor:
                h = table.linear(x, _m._fused_gate_up_weight, None)
                return table.linear(act_mul(_m, h), _m.down_proj.weight, _m.down_proj.bias)

            module.forward = _dispatch(eager, skinny_mlp)
            module._selfspec_skinny = True
            wrapped.add(f"{type(module).__name__}.gate_up+down")
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear):
        _route_linear(head, table)
        wrapped.add("lm_head")
    return sorted(wrapped)


def _route_linear(linear: torch.nn.Linear, table) -> None:
    if getattr(linear.forward, "_selfspec_fused", False):
        return
    table.select(linear.weight, linear.bias)
    linear.forward = _dispatch(linear.forward, lambda x, _l=linear: table.linear(x, _l.weight, _l.bias))
