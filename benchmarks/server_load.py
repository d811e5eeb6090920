"""Bounded load test of `selfspec serve` over loopback: streaming clients, then disconnects.

Starts the server as a subprocess on 127.0.0.1 (or uses --url, loopback only), then:

1. references: each distinct prompt once, non-streaming, greedy;
2. load: `--clients` concurrent streaming clients send `--requests` requests in all
   (a fixed count; the script stops by itself). Every response must end with a
   finish_reason, a usage chunk and [DONE] (else *lost* or *truncated*), and its text
   must equal the reference (greedy decoding is exact under batching);
3. disconnects: `--disconnects` clients start long streams, read a few chunks, and hang
   up; their slots must be freed (read from /metrics).

Prints p50/p99 latency and time to first token, aggregate tokens/s, and the slot counts;
exits non-zero if anything was lost, truncated, different, or left holding a slot.

    python benchmarks/server_load.py --model tiny
    python benchmarks/server_load.py --model smollm2 --requests 128 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx
import numpy as np
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

    @property
    def latency(self) -> float:
        return self.ended - self.started

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started


@dataclass
class Report:
    results: list[StreamResult] = field(default_factory=list)
    wall_s: float = 0.0


def p50_p99(values: list[float]) -> tuple[float, float]:
    """The 50th and 99th percentiles, each an observed value (nearest rank); NaN when nothing completed."""
    if not values:
        return math.nan, math.nan
    p50, p99 = np.percentile(values, [50, 99], method="nearest")
    return float(p50), float(p99)


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of sample `name` with exactly `labels` in a /metrics page (Prometheus text format); 0 if absent."""
    wanted = labels or {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == wanted:
                return float(sample.value)
    return 0.0


def body(model: str, prompt: str, max_tokens: int, *, stream: bool, **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "selfspec": {"thinking": False},
        **({"stream_options": {"include_usage": True}} if stream else {}),
        **extra,
    }


# ---------------------------------------------------------------------- server process
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "selfspec.server",
        "--model",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-slots",
        str(args.num_slots),
        "--max-queue",
        str(max(64, args.clients + args.disconnects)),
        "--log-level",
        "warning",
    ]
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
                    content = choice["delta"].get("content")
                    if content:
                        if result.first_token is None:
                            result.first_token = time.perf_counter()
                        parts.append(content)
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
    async with httpx.AsyncClient(timeout=args.request_timeout) as http:
        out = []
        for prompt in PROMPTS:
            response = await http.post(
                url + "/v1/chat/completions", json=body(args.served_name, prompt, args.max_tokens, stream=False)
            )
            response.raise_for_status()
            data = response.json()
            out.append((data["choices"][0]["message"]["content"], data["usage"]["completion_tokens"]))
        return out


async def load_phase(url: str, args) -> Report:
    report = Report()
    next_index = 0
    limits = httpx.Limits(max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8)
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits) as http:

        async def client() -> None:
            nonlocal next_index
            while next_index < args.requests:
                i = next_index
                next_index += 1
                result = StreamResult(prompt_index=i % len(PROMPTS))
                payload = body(args.served_name, PROMPTS[result.prompt_index], args.max_tokens, stream=True)
                report.results.append(await stream_one(http, url, payload, result))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        report.wall_s = time.perf_counter() - started
    return report


async def disconnect_phase(url: str, args) -> dict:
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
        freed_after = None
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            now = (await http.get(url + "/metrics")).text
            if metric(now, "selfspec_slots_in_use") == 0 and metric(now, "selfspec_requests_in_flight") == 0:
                freed_after = time.perf_counter() - hung_up
                break
            await asyncio.sleep(0.05)
        final = (await http.get(url + "/metrics")).text
    return {
        "clients": args.disconnects,
        "chunks_read": [r.chunks for r in results],
        "finished_normally": sum(r.saw_done for r in results),
        "slots_in_use_while_streaming": metric(during, "selfspec_slots_in_use"),
        "slots_in_use_after": metric(final, "selfspec_slots_in_use"),
        "in_flight_after": metric(final, "selfspec_requests_in_flight"),
        "aborted_on_disconnect": metric(final, "selfspec_requests_aborted_total", DISCONNECTED) - aborted_before,
        "freed_within_s": freed_after,
    }


# ---------------------------------------------------------------------- main
def summarize(report: Report, refs: list[tuple[str, int]], args) -> tuple[dict, bool]:
    results = report.results
    lost = [r for r in results if r.error or not r.saw_done]
    truncated = [
        r
        for r in results
        if r not in lost
        and (
            r.finish_reason is None
            or r.completion_tokens is None
            or (r.finish_reason == "length" and r.completion_tokens != args.max_tokens)
        )
    ]
    complete = [r for r in results if r.ok]
    different = [r for r in complete if (r.text, r.completion_tokens) != refs[r.prompt_index]]
    latencies = [r.latency for r in complete]
    ttfts = [r.ttft for r in complete if r.ttft is not None]
    tokens = sum(r.completion_tokens for r in complete)
    latency_p50, latency_p99 = p50_p99(latencies)
    ttft_p50, ttft_p99 = p50_p99(ttfts)
    summary = {
        "requests": len(results),
        "clients": args.clients,
        "complete": len(complete),
        "lost": len(lost),
        "truncated": len(truncated),
        "different_from_reference": len(different),
        "wall_s": round(report.wall_s, 3),
        "latency_p50_s": round(latency_p50, 4),
        "latency_p99_s": round(latency_p99, 4),
        "ttft_p50_s": round(ttft_p50, 4),
        "ttft_p99_s": round(ttft_p99, 4),
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": round(tokens / report.wall_s, 1) if report.wall_s else 0.0,
        "errors": sorted({r.error for r in lost})[:5],
    }
    passed = not lost and not truncated and not different and len(results) == args.requests
    return summary, passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model for the server subprocess (tiny, smollm2, a path)")
    parser.add_argument("--url", default=None, help="use a running server (loopback only) instead of starting one")
    parser.add_argument("--served-name", default=None, help="the 'model' field to send (default: --model)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128, help="total streamed requests in the load phase")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--disconnects", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=400, help="max_tokens of the streams that hang up")
    parser.add_argument("--num-slots", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=None)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    args.served_name = args.served_name or args.model
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        raise SystemExit("--url must be a loopback address (127.0.0.1, localhost, ::1)")

    process = None
    url = args.url
    if url is None:
        process, url = start_server(args)
    try:
        refs = asyncio.run(references(url, args))
        report = asyncio.run(load_phase(url, args))
        load, load_ok = summarize(report, refs, args)
        disconnects = asyncio.run(disconnect_phase(url, args)) if args.disconnects else {}
        server_metrics = httpx.get(url + "/metrics").text
    finally:
        if process is not None:
            stop_server(process)

    disconnect_ok = not disconnects or (
        disconnects["slots_in_use_after"] == 0
        and disconnects["in_flight_after"] == 0
        and disconnects["aborted_on_disconnect"] == args.disconnects
        and disconnects["finished_normally"] == 0
    )
    print(
        f"model: {args.model}   server: {url}   slots: {args.num_slots}   engine steps: {metric(server_metrics, 'selfspec_engine_steps'):.0f}"
    )
    print(
        f"\nload: {load['requests']} streamed requests from {load['clients']} concurrent clients, max_tokens={args.max_tokens}"
    )
    print(
        f"  complete {load['complete']}   lost {load['lost']}   truncated {load['truncated']}   "
        f"different from reference {load['different_from_reference']}"
    )
    print(f"  latency p50 {load['latency_p50_s']:.3f} s   p99 {load['latency_p99_s']:.3f} s")
    print(f"  TTFT    p50 {load['ttft_p50_s']:.3f} s   p99 {load['ttft_p99_s']:.3f} s")
    print(
        f"  {load['completion_tokens']} tokens in {load['wall_s']:.2f} s = {load['aggregate_tokens_per_s']:.1f} tokens/s aggregate"
    )
    if load["errors"]:
        print(f"  errors: {load['errors']}")
    if disconnects:
        print(
            f"\ndisconnects: {disconnects['clients']} clients hung up after {min(disconnects['chunks_read'])}+ chunks "
            f"of a {args.long_tokens}-token stream"
        )
        print(
            f"  slots in use while streaming {disconnects['slots_in_use_while_streaming']:.0f} -> after hang-up "
            f"{disconnects['slots_in_use_after']:.0f} (freed within {disconnects['freed_within_s'] or float('nan'):.3f} s); "
            f"aborted on disconnect: {disconnects['aborted_on_disconnect']:.0f}; finished normally: {disconnects['finished_normally']}"
        )
    verdict = "PASS" if load_ok and disconnect_ok else "FAIL"
    print(f"\n{verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"model": args.model, "load": load, "disconnects": disconnects, "passed": verdict == "PASS"},
                f,
                indent=2,
            )
    sys.exit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
