"""`python -m selfspec.server` as a real process on a free loopback port, for tests with real clients.

Tests that drive the server the way users do (the OpenAI Agents SDK, LangChain, the CLI's
flags) need the whole process: flag parsing, model load, uvicorn, signal handling. One helper
starts it, waits for `/health`, and stops it with Ctrl-C (SIGINT), so every such test shuts it
down the same way and a server that dies during start shows its log in the failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A running server: its base URL (no `/v1`), the process and its log file."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


@contextmanager
def serve_process(
    args: Sequence[str], log_path: Path, *, startup_timeout: float = 120.0, stop_timeout: float = 30.0
) -> Iterator[ServerProcess]:
    """Run `python -m selfspec.server ARGS --port <free>` (one intra-op thread, output to
    `log_path`) until the block ends; then SIGINT, and a kill if it does not exit in time.
    The process's exit status is on `.process.returncode` afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "selfspec.server", *args, "--port", str(port)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
        try:
            deadline = time.monotonic() + startup_timeout
            while True:
                assert process.poll() is None, server.log()
                try:
                    if httpx.get(server.url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the server did not come up:\n" + server.log()
                time.sleep(0.2)
            yield server
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


__all__ = ["ServerProcess", "free_port", "serve_process"]
