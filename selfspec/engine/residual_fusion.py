"""Residual adds fused into the norms that follow them, inside the engine's fused forwards.

Why: in a pre-norm decoder layer (Llama, Qwen2/3, Qwen3.5, Qwen3-Next) every residual add is
an eager kernel of its own, read again at once by an RMSNorm: two adds per layer, each a
launch in the step's CUDA graph (72 of ~630 kernels of a Qwen3-8B step, ~0.11 ms on an H100).
vLLM runs `fused_add_rms_norm`; here one compiled function computes the sum and its norm in
one kernel:

- the add after the token mixer with the layer's `post_attention_layernorm`;
- the add after the MLP with the *next* norm: the next layer's `input_layernorm`, or the
  model's final norm after the last layer. The layer returns the sum as before and leaves the
  normed sum for that norm, which takes it when it is called on that very tensor.

How: the layer class's own `forward` is rewritten at the syntax level (`ast`), only where its
body has exactly the pre-norm statements below; the mixer and MLP calls stay transformers'
code, so a transformers version that changes them needs nothing here, and one that changes
the residual pattern is simply not fused (`fuse_residual_norms` reports what it fused). The
rewritten forward runs only inside `fusion.fused()`; elsewhere the layer runs its own code.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import threading
import types
from typing import Callable

import torch

from selfspec.engine.fusion import _dispatch

_pending = threading.local()

_MIXER_ADD = "hidden_states = residual + hidden_states"
_KEEP_RESIDUAL = "residual = hidden_states"
_POST_NORM = "hidden_states = self.post_attention_layernorm(hidden_states)"
_INPUT_NORM = "hidden_states = self.input_layernorm(hidden_states)"
_RETURN = "return hidden_states"

_ADD_NORM_MIXER = "residual, hidden_states = _selfspec_add_norm(self.post_attention_layernorm, residual, hidden_states)"
_ADD_NEXT = "return _selfspec_add_next(residual, hidden_states)"


def _stmt(source: str) -> str:
    return ast.dump(ast.parse(source).body[0])


def parse_forward(source: str) -> ast.Module | None:
    """A class's `forward` source as a module holding that one function, or None where a rewrite
    cannot stand outside its class (`super()` needs the class cell)."""
    if "super(" in source:
        return None
    tree = ast.parse(textwrap.dedent(source))
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != "forward":
        return None
    return tree


def rewrite_layer_forward(source: str) -> str | None:
    """The layer forward with its residual adds routed through the fused helpers, or None.

    Accepted only where the top-level body holds one `input_layernorm` call and exactly two
    residual adds: the first followed by `residual = hidden_states` and the post-attention
    norm, the second by `return hidden_states` as the last statement. Anything else (sandwich
    norms as in Gemma, `super()`, an extra add) returns None and the layer is left alone.
    """
    tree = parse_forward(source)
    if tree is None:
        return None
    body = tree.body[0].body
    dumps = [ast.dump(s) for s in body]
    add, keep, post, ret = _stmt(_MIXER_ADD), _stmt(_KEEP_RESIDUAL), _stmt(_POST_NORM), _stmt(_RETURN)
    adds = [i for i, d in enumerate(dumps) if d == add]
    if len(adds) != 2 or dumps.count(_stmt(_INPUT_NORM)) != 1 or dumps.count(_stmt(_POST_NORM)) != 1:
        return None
    first, second = adds
    if dumps[first + 1 : first + 3] != [keep, post] or second != len(body) - 2 or dumps[-1] != ret:
        return None
    if dumps.index(_stmt(_INPUT_NORM)) > first:
        return None
    body[second:] = [ast.parse(_ADD_NEXT).body[0]]
    body[first : first + 3] = [ast.parse(_ADD_NORM_MIXER).body[0]]
    return ast.unparse(ast.fix_missing_locations(tree))


_compiled: dict[tuple[type, str], Callable] = {}


def _add_norm_for(norm: torch.nn.Module, backend: str) -> Callable:
    """One compiled (sum, norm(sum)) per norm class; the class's eager forward is traced."""
    key = (type(norm), backend)
    if key not in _compiled:
        norm_forward = type(norm).forward

        def add_norm(module: torch.nn.Module, residual: torch.Tensor, x: torch.Tensor):
            summed = residual + x
            return summed, norm_forward(module, summed)

        _compiled[key] = torch.compile(add_norm, dynamic=True, backend=backend)
    return _compiled[key]


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place write counter; None under `torch.inference_mode`, which keeps none
    (there the identity check alone guards the hand-over)."""
    return None if tensor.is_inference() else tensor._version


def _take_pending(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor | None:
    pending = getattr(_pending, "value", None)
    _pending.value = None
    # The very tensor, unchanged since (its version counter moves with every in-place write).
    if pending is not None and pending[0] is hidden and pending[2] is norm and pending[3] == _version(hidden):
        return pending[1]
    return None


def _pending_aware(norm: torch.nn.Module) -> None:
    """Let a norm hand out the normed sum its previous layer left for exactly this tensor."""
    inner = norm.forward

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if not args and not kwargs:
            ready = _take_pending(norm, hidden_states)
            if ready is not None:
                return ready
        return inner(hidden_states, *args, **kwargs)

    norm.forward = _dispatch(inner, forward)
    norm._selfspec_pending_aware = True


def _decoder_stacks(model: torch.nn.Module) -> list[tuple[torch.nn.ModuleList, torch.nn.Module | None]]:
    """(layers, final norm) of each decoder stack: a module with a `layers` ModuleList."""
    stacks = []
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
            norm = getattr(module, "norm", None)
            stacks.append((layers, norm if isinstance(norm, torch.nn.Module) else None))
    return stacks


def fuse_residual_norms(model: torch.nn.Module, backend: str = "inductor") -> list[str]:
    """Inside `fusion.fused()`, run each pre-norm decoder layer's residual adds fused with the
    norms after them. Returns the layer classes fused, for reports. Idempotent."""
    fused: set[str] = set()
    code_by_class: dict[type, types.CodeType | None] = {}
    for layers, final_norm in _decoder_stacks(model):
        for index, layer in enumerate(layers):
            cls = type(layer)
            if getattr(layer.forward, "_selfspec_fused", False):
                continue
            if cls not in code_by_class:
                code_by_class[cls] = rewritten_code(cls, rewrite_layer_forward)
            code = code_by_class[cls]
            if code is None:
                continue
            after = layers[index + 1] if index + 1 < len(layers) else None
            next_norm = getattr(after, "input_layernorm", None) if after is not None else final_norm
            layer.forward = _dispatch(layer.forward, _bind(layer, next_norm, backend, code))
            if next_norm is not None and not getattr(next_norm, "_selfspec_pending_aware", False):
                _pending_aware(next_norm)
            fused.add(f"{cls.__name__}.residual+norm")
    return sorted(fused)


def rewritten_code(cls: type, rewrite: Callable[[str], str | None]) -> types.CodeType | None:
    """`cls.forward`'s source passed through `rewrite` and compiled, or None where it declines."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return None
    rewritten = rewrite(source)
    if rewritten is None:
        return None
    return compile(rewritten, f"<selfspec rewrite of {cls.__qualname__}.forward>", "exec")


def bind_rewritten(module: torch.nn.Module, code: types.CodeType, helpers: dict[str, Callable]) -> Callable:
    """The rewritten forward bound to `module`, its globals those of the class's module plus
    the rewrite's helpers (one namespace per module: helpers may close over the instance)."""
    namespace = dict(vars(sys.modules[type(module).__module__]))
    namespace.update(helpers)
    exec(code, namespace)
    return types.MethodType(namespace["forward"], module)


def _bind(
    layer: torch.nn.Module,
    next_norm: torch.nn.Module | None,
    backend: str,
    code: types.CodeType,
) -> Callable:
    def add_norm(norm: torch.nn.Module, residual: torch.Tensor, x: torch.Tensor):
        return _add_norm_for(norm, backend)(norm, residual, x)

    def add_next(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if next_norm is None or not isinstance(x, torch.Tensor):
            return residual + x
        summed, normed = _add_norm_for(next_norm, backend)(next_norm, residual, x)
        _pending.value = (summed, normed, next_norm, _version(summed))
        return summed

    return bind_rewritten(layer, code, {"_selfspec_add_norm": add_norm, "_selfspec_add_next": add_next})
