"""Shared fixtures."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def repo_script():
    """Load a script of the repository (e.g. "benchmarks/exactness/exactness_table.py") as a module, so tests
    call its functions directly; scripts are not part of the installed package."""

    def load(relative: str) -> ModuleType:
        path = REPO / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
