"""The Triton slot-attention kernel, interpreted on CPU (TRITON_INTERPRET=1, own process).

Checks the kernel against a float64 reference (grouped queries, several splits of the key
range, a sliding window, strided inputs as the engine passes them) and the engine with the
kernel against transformers `generate` (fp32, token for token). On a GPU the compiled
kernel runs through scripts/gpu_check.py.
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


def _run(what: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), what], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{what} ok" in proc.stdout


def test_kernel_matches_float64_reference():
    _run("kernel")


def test_engine_with_slot_attention_matches_generate():
    _run("engine")
