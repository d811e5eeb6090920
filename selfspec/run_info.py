"""What ran a result: the device's name and the library versions, written into every record.

Why: GPU results are compared across sessions and machines (the H200 report, training
manifests, CoSpec evals); a number without its device and versions cannot be rerun or
trusted. One place computes both so every writer says the same thing the same way.
"""

from __future__ import annotations

import importlib.metadata
import platform

import torch


def library_versions() -> dict[str, str]:
    """python, torch, transformers and (when installed) peft versions."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("transformers", "peft"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's with torch's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({torch.get_num_threads()} threads)"


__all__ = ["device_name", "library_versions"]
