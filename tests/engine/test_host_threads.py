"""The engine keeps torch's host ops on one thread when a GPU runs the model (`host_threads`)."""

from __future__ import annotations

import pytest
import torch

from selfspec.engine.host_threads import ENV, host_threads_for, limit_host_threads


def test_gpu_default_is_one_thread_and_cpu_keeps_its_threads(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert host_threads_for(torch.device("cuda")) == 1
    assert host_threads_for(torch.device("cpu")) is None


def test_environment_overrides_and_rejects_nonsense(monkeypatch):
    monkeypatch.setenv(ENV, "keep")
    assert host_threads_for(torch.device("cuda")) is None
    monkeypatch.setenv(ENV, "3")
    assert host_threads_for(torch.device("cpu")) == 3
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=ENV):
            host_threads_for(torch.device("cuda"))


def test_limit_applies_and_cpu_is_untouched(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv(ENV, raising=False)
        assert limit_host_threads(torch.device("cpu")) == before
        monkeypatch.setenv(ENV, "1")
        assert limit_host_threads(torch.device("cpu")) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
