"""The server subprocess (loopback only) and the HTTP clients that load it.

A client streams one chat completion and keeps what the figures need: the time of every
content chunk (TTFT, inter-token latency), the text (compared with a non-loaded reference:
greedy decoding is exact under batching) and the usage chunk (the token count, since a chunk
may carry several tokens when speculation accepts them together).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PROMPTS = [
    "What is the capital of France?",
    "Add 12 and 30, then explain the result.",
    "Write a Python function that adds two numbers.",
    "Name three colours of the rainbow.",
    "What is 7 times 8?",
    "Give a one-sentence summary of what a compiler does.",
    "List the first five prime numbers.",
    "Why is the sky blue? Answer briefly.",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DISCONNECTED = {"reason": "client disconnected"}  # the label of requests aborted because their client hung up


@dataclass
class StreamResult:
    prompt_index: int
    ok: bool = False
    error: str = ""
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    saw_done: bool = False
    started: float = 0.0
    first_token: float | None = None
    ended: float = 0.0
    chunks: int = 0
    chunk_times: list[float] = field(default_factory=list)

    @property
    def latency(self) -> float:
        return self.ended - self.started

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of sample `name` with exactly `labels` in a /metrics page (Prometheus text format); 0 if absent."""
    wanted = labels or {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == wanted:
                return float(sample.value)
    return 0.0


def body(model: str, prompt: str, max_tokens: int, *, stream: bool, thinking: bool = False, **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "selfspec": {"thinking": thinking},
        **({"stream_options": {"include_usage": True}} if stream else {}),
        **extra,
    }


# ---------------------------------------------------------------------- server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, speculation: str | None) -> tuple[subprocess.Popen, str]:
    """`python -m selfspec.server` on 127.0.0.1 with `--speculation MODE`; returns once /health answers."""
    port = free_port()
    command = [sys.executable, "-m", "selfspec.server", "--model", args.model, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--num-slots", str(args.num_slots), "--log-level", "warning"]
    command += ["--max-queue", str(max(64, max(args.concurrency) + args.disconnects))]
    command += ["--device", args.device, "--dtype", args.dtype]
    if speculation:
        command += ["--speculation", speculation]
    if args.max_len:
        command += ["--max-len", str(args.max_len)]
    process = subprocess.Popen(command, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited during startup (code {process.returncode})")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    process.kill()
    raise SystemExit("the server did not come up in time")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# ---------------------------------------------------------------------- clients
async def stream_one(
    http: httpx.AsyncClient,
    url: str,
    payload: dict,
    result: StreamResult,
    *,
    hang_up_after: int | None = None,
    holding: asyncio.Event | None = None,
    release: asyncio.Event | None = None,
) -> StreamResult:
    """One streamed chat completion; with `hang_up_after`, close the connection after that many chunks."""
    result.started = time.perf_counter()
    parts: list[str] = []
    try:
        async with http.stream("POST", url + "/v1/chat/completions", json=payload) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    result.saw_done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                    break
                if event.get("usage"):
                    result.completion_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    delta = choice["delta"]
                    text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                    if text:
                        now = time.perf_counter()
                        if result.first_token is None:
                            result.first_token = now
                        result.chunk_times.append(now)
                        parts.append(text)
                        result.chunks += 1
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if hang_up_after is not None and result.chunks >= hang_up_after:
                    holding.set()
                    await release.wait()
                    return result  # leaving the block closes the connection mid-stream
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.ended = time.perf_counter()
        result.text = "".join(parts)
    result.ok = (
        result.saw_done
        and result.finish_reason is not None
        and result.completion_tokens is not None
        and not result.error
    )
    return result


async def references(url: str, args) -> list[tuple[str, int]]:
    """Each prompt once, alone and non-streaming: the text and token count every loaded response must match."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as http:
        out = []
        for prompt in PROMPTS:
            payload = body(args.served_name, prompt, args.max_tokens, stream=False, thinking=args.thinking)
            response = await http.post(url + "/v1/chat/completions", json=payload)
            response.raise_for_status()
            data = response.json()
            message = data["choices"][0]["message"]
            text = (message.get("reasoning_content") or "") + (message.get("content") or "")
            out.append((text, data["usage"]["completion_tokens"]))
        return out


async def slots_after(url: str, timeout_s: float = 30.0) -> dict:
    """Slots and in-flight requests once the server has settled (polled up to `timeout_s`): both must reach 0."""
    async with httpx.AsyncClient(timeout=30) as http:
        deadline = time.perf_counter() + timeout_s
        while True:
            page = (await http.get(url + "/metrics")).text
            held = {
                "slots_in_use": metric(page, "selfspec_slots_in_use"),
                "in_flight": metric(page, "selfspec_requests_in_flight"),
            }
            if (held["slots_in_use"] == 0 and held["in_flight"] == 0) or time.perf_counter() > deadline:
                return held
            await asyncio.sleep(0.05)


async def disconnect_phase(url: str, args) -> dict:
    """`--disconnects` clients start long streams, read 3 chunks and hang up; their slots must be freed."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as http:
        before = (await http.get(url + "/metrics")).text
        aborted_before = metric(before, "selfspec_requests_aborted_total", DISCONNECTED)
        release = asyncio.Event()
        holding = [asyncio.Event() for _ in range(args.disconnects)]
        payload = body(
            args.served_name, "Count slowly from one to one thousand.", args.long_tokens, stream=True, ignore_eos=True
        )
        tasks = [
            asyncio.create_task(
                stream_one(
                    http, url, payload, StreamResult(prompt_index=-1), hang_up_after=3, holding=h, release=release
                )
            )
            for h in holding
        ]
        await asyncio.wait_for(asyncio.gather(*(h.wait() for h in holding)), args.request_timeout)
        during = (await http.get(url + "/metrics")).text
        hung_up = time.perf_counter()
        release.set()
        results = await asyncio.gather(*tasks)
    held = await slots_after(url)
    settled = time.perf_counter()
    freed = held["slots_in_use"] == 0 and held["in_flight"] == 0
    final = httpx.get(url + "/metrics").text
    return {
        "clients": args.disconnects,
        "chunks_read": [r.chunks for r in results],
        "finished_normally": sum(r.saw_done for r in results),
        "slots_in_use_while_streaming": metric(during, "selfspec_slots_in_use"),
        "slots_in_use_after": held["slots_in_use"],
        "in_flight_after": held["in_flight"],
        "aborted_on_disconnect": metric(final, "selfspec_requests_aborted_total", DISCONNECTED) - aborted_before,
        "freed_within_s": round(settled - hung_up, 3) if freed else None,
    }
