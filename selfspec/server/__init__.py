"""OpenAI-compatible HTTP server: one engine loop shared by every request.

`create_app(llm, ServerConfig(...))` builds the FastAPI app; `selfspec serve` (see
`selfspec.server.cli.serve_command`) loads a model and runs it with uvicorn.
"""

from selfspec.server.app import create_app
from selfspec.server.background import BackgroundServer
from selfspec.server.config import RequestDefaults, ServerConfig

__all__ = ["BackgroundServer", "RequestDefaults", "ServerConfig", "create_app"]
