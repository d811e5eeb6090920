"""Compile a Triton kernel for Hopper (sm_90) without a GPU, as tests of our kernels do.

Why: Triton's front end and PTX back end run on any machine, and they reject what the interpreter
lets through (a loop-carried value whose type changes, a scalar mask), so those errors fail a CPU
test instead of a GPU session.
"""

from __future__ import annotations


def compile_for_hopper(fn, signature: dict[str, str], constexprs: dict | None = None) -> dict[str, str]:
    """`fn` compiled for sm_90 with these argument types (`constexprs` are added to the signature
    as "constexpr"); returns the kernel's assembly by stage ("ttir", ..., "ptx")."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs or {})
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton_compile(source, target=GPUTarget("cuda", 90, 32)).asm
