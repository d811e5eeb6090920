"""Benchmark loaders and their registry.

``load_benchmark(name, path=..., limit=..., offset=..., **opts)`` returns
``list[BenchSample]`` for any name in :func:`available_benchmarks`. Loaders read
local files only (wheel data files or the shared datasets directory) and raise
FileNotFoundError naming the missing path and the option that overrides it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable

from ..plugins import PLUGIN_LOADERS, load_plugins
from .classeval import load_classeval
from .gsm8k import load_gsm8k
from .humaneval import load_humaneval
from .longproc import TASKS as LONGPROC_TASKS
from .longproc import load_longproc_all, load_longproc_task
from .math500 import load_math500
from .mbpp import load_mbpp
from .sample import BenchSample

Loader = Callable[..., list[BenchSample]]

_REGISTRY: dict[str, Loader] = {
    "humaneval": load_humaneval,
    "classeval": load_classeval,
    "gsm8k": load_gsm8k,
    "mbpp": load_mbpp,
    "math500": load_math500,
    "longproc": load_longproc_all,
    **{f"longproc/{task}": partial(load_longproc_task, task) for task in LONGPROC_TASKS},
}


def available_benchmarks() -> list[str]:
    """Registered benchmark names (built-in, then those of installed plugins), in a stable order."""
    load_plugins()
    return list(_REGISTRY) + [name for name in PLUGIN_LOADERS if name not in _REGISTRY]


def load_benchmark(
    name: str,
    *,
    path: str | Path | None = None,
    limit: int | None = None,
    offset: int = 0,
    **opts: Any,
) -> list[BenchSample]:
    """Load benchmark ``name``; extra ``opts`` go to its loader (LongProc: ``data_dir``, ``length``)."""
    load_plugins()
    loader = _REGISTRY.get(name) or PLUGIN_LOADERS.get(name)
    if loader is None:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(available_benchmarks())}")
    return loader(path=path, limit=limit, offset=offset, **opts)


__all__ = [
    "BenchSample",
    "LONGPROC_TASKS",
    "available_benchmarks",
    "load_benchmark",
    "load_classeval",
    "load_gsm8k",
    "load_humaneval",
    "load_longproc_all",
    "load_longproc_task",
    "load_math500",
    "load_mbpp",
]
