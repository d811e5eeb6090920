"""`engine.heap`: a GPU engine's long-lived objects frozen out of the collector's full passes."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from selfspec.engine.heap import ENV, freeze_long_lived


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process keeps collecting what its tests leave


def test_a_cpu_engine_keeps_the_default_collector(unfrozen):
    assert not freeze_long_lived(torch.device("cpu"))
    assert gc.get_freeze_count() == 0


def test_a_gpu_engine_freezes_what_exists_after_collecting_the_garbage(unfrozen, monkeypatch):
    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage  # only a full collection frees a cycle
    gone = weakref.ref(garbage)
    alive = [Cycle() for _ in range(100)]
    del garbage
    assert freeze_long_lived(torch.device("cuda"))  # the device object needs no GPU
    assert gone() is None  # collected, not frozen
    assert gc.get_freeze_count() >= len(alive)
    ids = {id(o) for o in alive}
    assert not any(id(o) in ids for generation in range(3) for o in gc.get_objects(generation=generation))
    gc.unfreeze()
    monkeypatch.setenv(ENV, "0")
    assert not freeze_long_lived(torch.device("cuda")) and gc.get_freeze_count() == 0


def test_what_an_earlier_freeze_kept_is_freed_at_the_next_once_dropped(unfrozen):
    """A script that builds one engine, drops it and builds another: the first engine's cycles
    were frozen with it, and the next freeze frees them."""

    class Engine:
        pass

    first = Engine()
    first.me = first
    gone = weakref.ref(first)
    assert freeze_long_lived(torch.device("cuda"))
    del first
    gc.collect()
    assert gone() is not None  # frozen: no collection visits it
    assert freeze_long_lived(torch.device("cuda"))
    assert gone() is None
