"""Benchmarks contributed by other installed parts (`selfspec_bench.benchmarks` entry points).

Why: the harness must not import the research code that generates some workloads (the
thinker's task families), yet `selfspec bench -b thinker/<family>` should work once that
part is installed. Each entry point is a callable that receives `add_benchmark(name,
loader, scorer)`; they are loaded once, on the first lookup.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

Loader = Callable[..., list]
Scorer = Callable[..., object]

ENTRY_POINT_GROUP = "selfspec_bench.benchmarks"
_loaded = False
PLUGIN_LOADERS: dict[str, Loader] = {}
PLUGIN_SCORERS: dict[str, Scorer] = {}


def add_benchmark(name: str, loader: Loader, scorer: Scorer) -> None:
    """Register one benchmark's loader and scorer under `name`."""
    PLUGIN_LOADERS[name] = loader
    PLUGIN_SCORERS[name] = scorer


def load_plugins() -> None:
    """Call every installed `selfspec_bench.benchmarks` entry point once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        point.load()(add_benchmark)
