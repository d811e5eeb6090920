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
    assert len(versions["selfspec_source"]) == 12 and int(versions["selfspec_source"], 16) >= 0


def test_source_hash_changes_with_the_code(tmp_path, monkeypatch):
    from selfspec import run_info

    before = run_info.source_hash()
    run_info.source_hash.cache_clear()
    package = tmp_path / "selfspec"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(run_info, "__file__", str(package / "run_info.py"))
    first = run_info.source_hash()
    run_info.source_hash.cache_clear()
    (package / "a.py").write_text("x = 2\n")
    assert run_info.source_hash() != first
    run_info.source_hash.cache_clear()
    monkeypatch.undo()
    assert run_info.source_hash() == before


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


def test_co_tenants_count_the_other_rows_of_this_gpu():
    """nvidia-smi lists every compute process per GPU UUID; this process is one of its GPU's
    rows (its PID may be a host PID inside a container, so rows are counted, not PIDs)."""
    from selfspec.run_info import count_co_tenants

    listing = "GPU-aa11-22bb, 101\nGPU-aa11-22bb, 202\nGPU-bbbb-0000, 303\n"
    assert count_co_tenants(listing, "aa11-22bb") == 1  # torch's uuid has no "GPU-" prefix
    assert count_co_tenants(listing, "aa1122bb") == 1  # nor, perhaps, hyphens
    assert count_co_tenants(listing, "GPU-BBBB-0000") == 0
    assert count_co_tenants(listing, "cccc") is None  # no row of this GPU: the listing cannot tell
    assert count_co_tenants("", "aaaa") is None  # a listing that hides processes cannot tell
    assert count_co_tenants("No running processes found\n", "aaaa") is None


def test_co_tenants_are_unknown_on_a_cpu_or_without_nvidia_smi(monkeypatch):
    from selfspec import run_info

    assert run_info.gpu_co_tenants("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(run_info.shutil, "which", lambda name: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"uuid": "aaaa"})())
    assert run_info.gpu_co_tenants("cuda:0") is None
