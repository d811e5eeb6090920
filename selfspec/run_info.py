"""What ran a result: the device's name and the library versions, written into every record.

Why: GPU results are compared across sessions and machines (the H200 report, training
manifests, CoSpec evals); a number without its device and versions cannot be rerun or
trusted. One place computes both so every writer says the same thing the same way.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import shutil
import subprocess
from pathlib import Path

import torch


def library_versions() -> dict[str, str]:
    """python, torch, transformers and (when installed) peft versions; on a GPU machine also
    the CUDA runtime torch was built with, cuDNN and the driver (what the GPU computes can
    change with them while every Python package's version stays the same)."""
    versions = {"python": platform.python_version(), "torch": torch.__version__, "selfspec_source": source_hash()}
    for package in ("transformers", "peft"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
        if torch.backends.cudnn.is_available():
            versions["cudnn"] = str(torch.backends.cudnn.version())
        driver = nvidia_driver_version()
        if driver:
            versions["nvidia_driver"] = driver
    return versions


@functools.cache
def source_hash() -> str:
    """A short hash of the selfspec package's Python sources as they ran.

    Why: results are made from working trees copied to a GPU machine without git, and one
    benchmark file may be resumed across sessions by changed code (session 8 changed what a
    step feeds after a forced end of thinking); the hash tells which records one code made."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@functools.cache
def nvidia_driver_version() -> str | None:
    """The driver's version as nvidia-smi reports it; None where nvidia-smi is absent or fails."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        result = subprocess.run([executable, "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's with torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({torch.get_num_threads()} threads)"


__all__ = ["device_name", "library_versions", "nvidia_driver_version"]
