"""The skinny-GEMM and KV-write Triton kernels, interpreted on CPU (TRITON_INTERPRET=1, own process).

Checks each kernel against a float64 / advanced-indexing reference (row counts 1-64, bias,
strided inputs, the scratch slot), that a row's GEMM output does not depend on the other rows,
and the engine with both kernels against transformers `generate` (fp32, token for token). On a
GPU the compiled kernels run through the engine benchmarks, which record which shapes chose them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

SCRIPT = Path(__file__).parent / "scripts" / "decode_kernels_checks.py"


def _run(what: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), what], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{what} ok" in proc.stdout


def test_skinny_gemm_matches_reference_and_is_batch_invariant():
    _run("skinny")


def test_kv_write_matches_advanced_indexing():
    _run("kv_write")


def test_engine_with_skinny_gemms_matches_generate():
    _run("engine")


def test_skinny_table_keeps_cublas_off_the_gpu():
    """Without a measurement (CPU weights) every shape keeps `F.linear`."""
    import torch

    from selfspec.engine.skinny_gemm import SkinnyGemmTable

    table = SkinnyGemmTable()
    w = torch.randn(8, 4)
    assert table.select(w) is None
    x = torch.randn(2, 4)
    assert torch.equal(table.linear(x, w, None), torch.nn.functional.linear(x, w))
    assert table.report()["choice"] == {"8x4": "cublas"}


def test_a_shapes_kernel_is_chosen_over_every_measured_row_count():
    """The config fastest at one row but slow at 32 (each program reloading every row's inputs)
    loses to one near the best at both; a config out at some row count is never chosen; cuBLAS
    wins where it is the balanced choice."""
    from selfspec.engine.skinny_gemm import choose_config

    times = {
        "cublas": {1: 14.0, 8: 14.2, 32: 15.0},
        "n16k512": {1: 12.0, 8: 13.0, 32: 24.0},  # one-row winner
        "n64k128": {1: 12.6, 8: 12.8, 32: 14.0},
        "n128k128": {1: 11.0, 8: 11.5},  # failed its 32-row check
    }
    assert choose_config(times) == "n64k128"
    times["n64k128"][32] = 19.0
    assert choose_config(times) == "cublas"
    assert choose_config({"cublas": {1: 3.0}, "n16k256": {1: 2.0}}) == "n16k256"


def test_kernels_compile_for_hopper_without_a_gpu():
    """Triton's front end and PTX back end run without a device: errors the interpreter lets
    through fail here, not on the H200."""
    from selfspec.engine import kv_write, skinny_gemm
    from selfspec.testing.ptx import compile_for_hopper

    for block_m, config in [(16, skinny_gemm.CONFIGS[0]), (64, skinny_gemm.CONFIGS[-1].with_pdl())]:
        for has_bias in (False, True):
            signature = {
                "x_ptr": "*bf16",
                "w_ptr": "*bf16",
                "b_ptr": "*bf16",
                "out_ptr": "*bf16",
                **{n: "i32" for n in ("M", "N", "K", "sx_m", "sw_n", "so_m")},
            }
            constexprs = {
                "HAS_BIAS": has_bias,
                "BLOCK_M": block_m,
                "BLOCK_N": config.block_n,
                "BLOCK_K": config.block_k,
                "USE_PDL": config.pdl,
            }
            asm = compile_for_hopper(skinny_gemm._skinny_kernel, signature, constexprs)
            assert "ptx" in asm
            assert ("griddepcontrol.wait" in asm["ptx"]) == config.pdl
    ints = ["T", "D", "sk_b", "sk_h", "sk_t", "sv_b", "sv_h", "sv_t", "sb_s", "sb_h", "sb_n"]
    signature = {
        "k_ptr": "*bf16",
        "v_ptr": "*bf16",
        "kb_ptr": "*bf16",
        "vb_ptr": "*bf16",
        "slots_ptr": "*i64",
        "pos_ptr": "*i64",
        **{n: "i32" for n in ints},
    }
    for use_pdl in (False, True):
        asm = compile_for_hopper(kv_write._kv_write_kernel, signature, {"BLOCK_D": 128, "USE_PDL": use_pdl})
        assert "ptx" in asm
        assert ("griddepcontrol.wait" in asm["ptx"]) == use_pdl


def test_select_rows_reads_its_override_and_refuses_bad_counts(monkeypatch):
    import pytest

    from selfspec.engine.skinny_gemm import SELECT_ROWS, SELECT_ROWS_ENV, select_rows

    assert select_rows() == SELECT_ROWS
    monkeypatch.setenv(SELECT_ROWS_ENV, "1")
    assert select_rows() == (1,)
    monkeypatch.setenv(SELECT_ROWS_ENV, "1,8,65")
    with pytest.raises(ValueError, match="1..64"):
        select_rows()
