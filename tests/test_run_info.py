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
