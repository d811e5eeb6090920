"""OpenAI-compatible HTTP server: one engine loop shared by every request.

`create_app(llm, ServerConfig(...))` builds the FastAPI app; `selfspec serve` (see
`selfspec.server.cli.serve_command`) loads a model and runs it with uvicorn. Names are
imported on first use, so the CLI can register `serve` without importing torch/FastAPI.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "selfspec.server.app",
    "BackgroundServer": "selfspec.server.background",
    "RequestDefaults": "selfspec.server.config",
    "ServerConfig": "selfspec.server.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'selfspec.server' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
