"""selfspec.run_info: every result names its device and library versions the same way."""

from __future__ import annotations

import platform

import torch

from selfspec.run_info import device_name, library_versions


def test_versions_name_the_libraries_that_ran():
    versions = library_versions()
    assert versions["python"] == platform.python_version() and versions["torch"] == torch.__version__
    import transformers

    assert versions["transformers"] == transformers.__version__


def test_cpu_device_name_says_cpu_and_threads():
    name = device_name("cpu")
    assert "CPU" in name and f"({torch.get_num_threads()} threads)" in name


def test_gpu_fields_appear_only_with_a_gpu(monkeypatch):
    from selfspec import run_info

    assert "cuda" not in library_versions() or torch.cuda.is_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(run_info, "nvidia_driver_version", lambda: "580.95.05")
    versions = library_versions()
    assert versions["cuda"] == "13.0" and versions["nvidia_driver"] == "580.95.05"


def test_driver_version_is_none_without_nvidia_smi(monkeypatch):
    from selfspec import run_info

    run_info.nvidia_driver_version.cache_clear()
    monkeypatch.setattr(run_info.shutil, "which", lambda name: None)
    try:
        assert run_info.nvidia_driver_version() is None
    finally:
        run_info.nvidia_driver_version.cache_clear()
