"""Run an app with uvicorn in a background thread (tests, benchmarks, notebooks).

Binds 127.0.0.1 on a free port (port 0) and reports the port the OS chose, so several
servers can run side by side. The app's lifespan (the engine loop) starts before
`start()` returns and stops in `stop()`.
"""

from __future__ import annotations

import threading
import time

import uvicorn

from selfspec.server.connections import uvicorn_options


class BackgroundServer:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False, **uvicorn_options()
        )
        self.server = uvicorn.Server(self.config)
        self.host = host
        self.port: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        self._thread = threading.Thread(target=self.server.run, name="selfspec-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not start in time")
            time.sleep(0.01)
        sockets = [s for server in self.server.servers for s in server.sockets]
        self.port = sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
