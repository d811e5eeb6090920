"""Run a snippet with Triton kernels interpreted on the CPU, in its own process.

Why a process of its own: `TRITON_INTERPRET=1` must be set before Triton compiles anything, and
only the kernels of the snippet may be interpreted (the test process's other kernels must not).
The snippet runs from the repository root (so it can import `tests.*` helpers) and prints one JSON
line last, which is returned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_interpreted(code: str, timeout: float = 600) -> dict:
    """Run `code` (dedented) under Triton's interpreter, one thread; its last stdout line as JSON."""
    root = str(REPO_ROOT)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
