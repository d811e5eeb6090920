"""The wheel is the product: inference code only, no weights, no bench or research code."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_holds_inference_only(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("selfspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"selfspec"}, tops
    assert not [n for n in names if n.endswith((".safetensors", ".gguf", ".jsonl", ".png"))]
    assert "selfspec/cli/demo_prompt.txt" in names  # the demo's prompt ships with the CLI
    assert wheel.stat().st_size < 2_000_000
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    core = [r for r in requires if "extra ==" not in r]
    for optional in ("peft", "fastapi", "matplotlib", "scipy", "accelerate", "uvicorn"):
        assert not any(r.split()[1].lower().startswith(optional) for r in core), (optional, core)
