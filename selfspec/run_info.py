"""What ran a result: the device's name and the library versions, written into every record.

Why: GPU results are compared across runs and machines (the H200 report, training
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
    benchmark file may be resumed later by changed code (e.g. a change of what a step feeds
    after a forced end of thinking); the hash tells which records one code made."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _nvidia_smi(query: str) -> str | None:
    """`nvidia-smi <query> --format=csv,noheader`'s output; None where nvidia-smi is absent or fails."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        result = subprocess.run(
            [executable, query, "--format=csv,noheader"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout


@functools.cache
def nvidia_driver_version() -> str | None:
    """The driver's version as nvidia-smi reports it; None where nvidia-smi is absent or fails."""
    lines = (_nvidia_smi("--query-gpu=driver_version") or "").strip().splitlines()
    return lines[0].strip() if lines else None


def count_co_tenants(compute_apps_csv: str, gpu_uuid: str) -> int | None:
    """Other processes holding a compute context on the GPU `gpu_uuid`, from the lines of
    `nvidia-smi --query-compute-apps=gpu_uuid,pid --format=csv,noheader`.

    The caller holds a context itself, so it is one of the GPU's rows; PIDs are not compared
    because inside a container nvidia-smi may list host PIDs. No row for the GPU at all means
    the listing hides processes (some containers do): unknown, None."""

    def normal(uuid: str) -> str:  # nvidia-smi writes GPU-8-4-4-4-12 hex; torch may drop the prefix or hyphens
        return uuid.strip().lower().removeprefix("gpu-").replace("-", "")

    wanted = normal(gpu_uuid)
    rows = 0
    for line in compute_apps_csv.splitlines():
        fields = line.split(",")
        if len(fields) >= 2 and normal(fields[0]) == wanted:
            rows += 1
    return rows - 1 if rows else None


def gpu_co_tenants(device: torch.device | str) -> int | None:
    """How many other processes use this process's GPU right now; None on a CPU, without
    nvidia-smi, or where the listing cannot tell.

    Why: two benchmark queues sharing one H200 made every forward take 1.7-2.1x as long as
    with each queue on its own GPU: with CUDA graphs the
    engine keeps the GPU busy, and processes time-slice it. Records say whether they ran
    alone, so the report can keep absolute latencies of shared and exclusive runs apart."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    listing = _nvidia_smi("--query-compute-apps=gpu_uuid,pid") if uuid is not None else None
    return None if listing is None else count_co_tenants(listing, str(uuid))


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's with torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({torch.get_num_threads()} threads)"


__all__ = ["count_co_tenants", "device_name", "gpu_co_tenants", "library_versions", "nvidia_driver_version"]
