"""The Triton slot-attention kernel, interpreted on CPU (TRITON_INTERPRET=1, own process).

Checks the kernel against a float64 reference (grouped queries, several splits of the key
range, a sliding window, strided inputs as the engine passes them) and the engine with the
kernel against transformers `generate` (fp32, token for token). On a GPU the compiled
kernel runs through tools/gpu/gpu_check.py.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

SCRIPT = Path(__file__).parent / "scripts" / "slot_attention_checks.py"


def _run(what: str, **extra_env: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", **extra_env}
    proc = subprocess.run([sys.executable, str(SCRIPT), what], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{what} ok" in proc.stdout


def test_kernel_matches_float64_reference():
    _run("kernel")


def test_engine_with_slot_attention_matches_generate():
    _run("engine")


def test_engine_with_16_keys_per_split_matches_generate():
    """Splits of 16 keys: the key buckets 32 and 64 merge 2 and 4 splits in the reduce kernel."""
    _run("engine", SELFSPEC_SLOT_ATTENTION_KEYS_PER_SPLIT="16")


def test_keys_per_split_is_read_from_the_environment(monkeypatch):
    from selfspec.engine import slot_attention as sa

    monkeypatch.delenv(sa.KEYS_PER_SPLIT_ENV, raising=False)
    assert sa.keys_per_split() == 512
    monkeypatch.setenv(sa.KEYS_PER_SPLIT_ENV, "128")
    assert sa.keys_per_split() == 128
    for bad in ("100", "0"):
        monkeypatch.setenv(sa.KEYS_PER_SPLIT_ENV, bad)
        with pytest.raises(ValueError, match="multiple of 16"):
            sa.keys_per_split()


def test_kernels_compile_for_hopper_without_a_gpu():
    """Triton's front end and PTX back end run without a device: errors that the interpreter
    lets through (e.g. a variable whose integer type changes in a branch) fail here, not on
    the H200."""
    from selfspec.engine import slot_attention as sa
    from selfspec.testing.ptx import compile_for_hopper

    ints = [
        "sq_b",
        "sq_t",
        "sq_h",
        "sq_d",
        "sk_s",
        "sk_h",
        "sk_n",
        "sk_d",
        "so_b",
        "so_t",
        "so_h",
        "s_slot",
        "sp_b",
        "sp_t",
        "T",
        "blocks",
        "window",
        "keys_per_split",
        "splits",
    ]
    for dtype, splits, ieee, tb in [
        ("bf16", 1, False, 1),
        ("bf16", 4, False, 1),
        ("fp32", 2, True, 1),
        ("bf16", 4, False, 5),
    ]:
        signature = {
            "q_ptr": f"*{dtype}",
            "k_ptr": f"*{dtype}",
            "v_ptr": f"*{dtype}",
            "slots_ptr": "*i64",
            "pos_ptr": "*i64",
            "out_ptr": f"*{dtype}",
            "part_ptr": "*fp32",
            **{n: "i32" for n in ints},
            "scale": "fp32",
        }
        constexprs = {"G": 3, "GP": 16, "TB": tb, "D": 64, "BLOCK_N": 64, "SINGLE": splits == 1, "IEEE": ieee}
        assert "ptx" in compile_for_hopper(sa._slot_attention_kernel, signature, constexprs)
    reduce_sig = {
        "part_ptr": "*fp32",
        "out_ptr": "*bf16",
        "so_b": "i32",
        "so_t": "i32",
        "so_h": "i32",
        "T": "i32",
        "HQ": "i32",
        "splits": "i32",
    }
    assert "ptx" in compile_for_hopper(sa._reduce_kernel, reduce_sig, {"D": 64})
