"""Per-head q/k norms and rotary embedding as one compiled function, inside the engine's fused forwards.

Why: Qwen3, Qwen3.5, Qwen3-Next and Gemma-3 normalise every query and key head (`q_norm`, `k_norm`)
and then rotate them: four kernels per attention layer once each piece is compiled on its own
(two norms, rotary for q and for k), 144 of a Qwen3-8B step's ~630. Compiled together the
norms run inside the rotary kernels (inductor: one kernel per output), which removes two
launches per layer and a write and read of q and k.

How: the attention class's `forward` is rewritten at the syntax level (as
`residual_fusion` does for decoder layers), only where it has these statements in order:

    query_states = self.q_norm(Q).transpose(1, 2)      (or, Gemma-3: a statement
    key_states = self.k_norm(K).transpose(1, 2)         `query_states = self.q_norm(query_states)`)
    ...
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

The norms move after the transposes (a norm over the last dimension does not care) into the
rotary call: `Q` and `K` keep transformers' own expressions (the gated query of Qwen3.5
included). Anything else (Gemma-4's rotary per tensor) is left alone.
"""

from __future__ import annotations

import ast
import sys
from typing import Callable

import torch

from selfspec.engine.fusion import _dispatch
from selfspec.engine.residual_fusion import bind_rewritten, parse_forward, rewritten_code

_ROPE_CALL = "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)"
_FUSED_CALL = "query_states, key_states = _selfspec_norm_rope(self, query_states, key_states, cos, sin)"


def _normed_transpose(stmt: ast.stmt, target: str, norm: str) -> ast.expr | None:
    """`X` of `<target> = self.<norm>(X).transpose(1, 2)`, else None."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return None
    name, call = stmt.targets[0], stmt.value
    if not (isinstance(name, ast.Name) and name.id == target and isinstance(call, ast.Call)):
        return None
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "transpose" and not call.keywords):
        return None
    if [ast.dump(a) for a in call.args] != [ast.dump(ast.Constant(1)), ast.dump(ast.Constant(2))]:
        return None
    inner = func.value
    if not (isinstance(inner, ast.Call) and len(inner.args) == 1 and not inner.keywords):
        return None
    owner = inner.func
    if not (isinstance(owner, ast.Attribute) and owner.attr == norm and isinstance(owner.value, ast.Name)):
        return None
    return inner.args[0] if owner.value.id == "self" else None


def _normed_in_place(stmt: ast.stmt, target: str, norm: str) -> bool:
    """Whether `stmt` is `<target> = self.<norm>(<target>)` (Gemma-3's form, after the transposes)."""
    want = ast.parse(f"{target} = self.{norm}({target})").body[0]
    return ast.dump(stmt) == ast.dump(want)


def rewrite_attention_forward(source: str) -> str | None:
    """The attention forward with its q/k norms folded into the rotary call, or None.

    Two forms of norm are taken: `q = self.q_norm(X).transpose(1, 2)` (Qwen3, Qwen3.5, Qwen3-Next),
    which becomes `q = X.transpose(1, 2)`, and a statement `q = self.q_norm(q)` of its own (Gemma-3),
    which goes.
    """
    tree = parse_forward(source)
    if tree is None:
        return None
    body = tree.body[0].body
    rope = ast.dump(ast.parse(_ROPE_CALL).body[0])
    found: dict[str, list[int]] = {"q": [], "k": [], "rope": []}
    for i, stmt in enumerate(body):
        for key, target, norm in (("q", "query_states", "q_norm"), ("k", "key_states", "k_norm")):
            if _normed_transpose(stmt, target, norm) is not None or _normed_in_place(stmt, target, norm):
                found[key].append(i)
        if ast.dump(stmt) == rope:
            found["rope"].append(i)
    if any(len(v) != 1 for v in found.values()):
        return None
    (q,), (k,), (r,) = found["q"], found["k"], found["rope"]
    if not (q < r and k < r):
        return None
    # Nothing between the norms and the rotary may read the normed q or k.
    for stmt in body[min(q, k) + 1 : r]:
        if stmt is body[q] or stmt is body[k]:
            continue
        if any(isinstance(n, ast.Name) and n.id in ("query_states", "key_states") for n in ast.walk(stmt)):
            return None
    body[r] = ast.parse(_FUSED_CALL).body[0]
    for index, target, norm in sorted(((q, "query_states", "q_norm"), (k, "key_states", "k_norm")), reverse=True):
        inner = _normed_transpose(body[index], target, norm)
        if inner is None:
            del body[index]  # the norm statement of its own
        else:
            body[index].value.func.value = inner  # X.transpose(1, 2)
    return ast.unparse(ast.fix_missing_locations(tree))


_compiled: dict[tuple[type, str], Callable] = {}


def _norm_rope_for(attention: torch.nn.Module, backend: str) -> Callable | None:
    """One compiled norm-and-rotate per attention class (its norms' and module's rotary code)."""
    cls = type(attention)
    key = (cls, backend)
    if key not in _compiled:
        rope = getattr(sys.modules[cls.__module__], "apply_rotary_pos_emb", None)
        rope = getattr(rope, "__wrapped__", rope)  # transformers' own, not the engine's dispatcher
        q_forward, k_forward = type(attention.q_norm).forward, type(attention.k_norm).forward

        def norm_rope(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
            return rope(q_forward(module.q_norm, q), k_forward(module.k_norm, k), cos, sin)

        _compiled[key] = torch.compile(norm_rope, dynamic=True, backend=backend) if rope is not None else None
    return _compiled[key]


def fuse_qk_norm_rope(model: torch.nn.Module, backend: str = "inductor") -> list[str]:
    """Inside `fusion.fused()`, run each matching attention layer's q/k norms inside its rotary
    call. Returns the attention classes fused, for reports. Idempotent."""
    fused: set[str] = set()
    code_by_class: dict = {}
    for module in model.modules():
        cls = type(module)
        if not (
            isinstance(getattr(module, "q_norm", None), torch.nn.Module)
            and isinstance(getattr(module, "k_norm", None), torch.nn.Module)
        ):
            continue
        if getattr(module.forward, "_selfspec_fused", False):
            continue
        if cls not in code_by_class:
            code_by_class[cls] = rewritten_code(cls, rewrite_attention_forward)
        code = code_by_class[cls]
        if code is None or _norm_rope_for(module, backend) is None:
            continue

        def norm_rope(attention, q, k, cos, sin, _backend=backend):
            return _norm_rope_for(attention, _backend)(attention, q, k, cos, sin)

        module.forward = _dispatch(module.forward, bind_rewritten(module, code, {"_selfspec_norm_rope": norm_rope}))
        fused.add(f"{cls.__name__}.qk_norm+rope")
    return sorted(fused)
