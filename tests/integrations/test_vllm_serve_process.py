"""`selfspec serve --backend vllm` as a user starts it: a real process, flags only, real HTTP.

What only a process shows: the flags reach vLLM (`--vllm-arg`), the server-wide SSR defaults
apply to a request that names no method, SSR's text equals a plain request's, a malformed body
is a 400 without harming the server, and Ctrl-C stops vLLM's engine with the server (exit 0).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

import httpx  # noqa: E402

from .test_vllm_ssr import _save  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(process: subprocess.Popen, url: str, log_path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, log_path.read_text()[-4000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up:\n" + log_path.read_text()[-4000:]
        time.sleep(0.5)


def test_serve_backend_vllm_process(tmp_path):
    model_dir = _save(tmp_path / "bigram", "bigram")
    port = free_port()
    vllm_args = ["enforce_eager=true", "kv_cache_memory_bytes=268435456"]
    command = [sys.executable, "-m", "selfspec.server", "--backend", "vllm", "--model", str(model_dir)]
    command += ["--served-model-name", "tiny", "--port", str(port), "--num-slots", "4", "--max-len", "512"]
    command += ["--dtype", "float32"]
    command += ["--ssr", "--draft-budget", "8", "--max-draft-len", "24", "--cot-cap", "20", "--answer-cap", "24"]
    command += ["--log-level", "warning"]
    for arg in vllm_args:
        command += ["--vllm-arg", arg]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    log_path = tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            wait_healthy(process, url, log_path, 600)
            body = {"model": "tiny", "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 80}
            ssr = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
            assert ssr.status_code == 200, ssr.text
            usage = ssr.json()["usage"]["selfspec"]
            assert usage["mode"] == "ssr" and usage["drafts"] >= 1 and usage["cot_tokens"] == 20
            plain = httpx.post(url + "/v1/chat/completions", json={**body, "selfspec": {"ssr": False}}, timeout=120)
            assert plain.status_code == 200, plain.text
            assert plain.json()["usage"]["selfspec"]["mode"] == "plain"
            assert plain.json()["choices"][0]["message"] == ssr.json()["choices"][0]["message"]

            broken = httpx.post(
                url + "/v1/chat/completions",
                content=b'{"model": "tiny", "messages": [',
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
            assert httpx.get(url + "/health", timeout=5).status_code == 200
            assert "selfspec_ssr" in httpx.get(url + "/metrics", timeout=5).text
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert process.returncode == 0, log_path.read_text()[-4000:]
