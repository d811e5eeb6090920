"""Load benchmark of `selfspec serve` over loopback, modelled on vLLM's benchmark_serving.

For each server mode (`--modes off,auto`: one server per mode, started with `--speculation MODE`
on 127.0.0.1, or `--url`, loopback only, for one running server) and each concurrency level
(`--concurrency 1,4,16,64`):

1. references: each distinct prompt once, alone, non-streaming, greedy (once per server);
2. a level: `c` clients in flight send max(2c, `--min-requests`) streamed requests (or, with
   `--request-rate R`, requests arrive as a Poisson process of rate R, at most `c` in flight).
   Every response must end with a finish_reason, a usage chunk and [DONE] (else lost or
   truncated), and its text must equal the reference (greedy decoding is exact under
   batching); afterwards no slot may stay held (read from /metrics);
3. disconnects: `--disconnects` clients start long streams, read a few chunks and hang up;
   their slots must be freed.

Per level: completed / errors / lost / truncated / different counts, duration, request and output
token throughput, TTFT, ITL (per token), TPOT and end-to-end latency (mean, p50, p99). A line is
printed per level as it finishes; `--out-dir` writes results.json, README.md and a plot. Exits
non-zero if anything was lost, truncated, different, errored or left holding a slot.

    python benchmarks/server_load.py --model tiny --concurrency 1,4,16,64 --out-dir /tmp/load
    python benchmarks/server_load.py --model smollm2 --concurrency 1,4,16 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the server_load package beside this script

from server_load import output  # noqa: E402
from server_load.clients import (  # noqa: E402
    LOOPBACK,
    PROMPTS,
    StreamResult,
    body,
    disconnect_phase,
    references,
    slots_after,
    start_server,
    stop_server,
    stream_one,
)
from server_load.stats import level_passed, summarize_level  # noqa: E402


def requests_at(concurrency: int, args) -> int:
    return max(2 * concurrency, args.min_requests)


async def run_level(url: str, concurrency: int, args, seed: int) -> tuple[list[StreamResult], float]:
    """`concurrency` clients in flight (closed loop), or Poisson arrivals capped at `concurrency` in flight."""
    n = requests_at(concurrency, args)
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        if args.request_rate:
            t += rng.expovariate(args.request_rate)
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    results: list[StreamResult] = []
    async with httpx.AsyncClient(timeout=args.request_timeout, limits=limits) as http:
        started = time.perf_counter()

        async def one(i: int) -> None:
            await asyncio.sleep(max(0.0, started + arrivals[i] - time.perf_counter()))
            async with gate:
                result = StreamResult(prompt_index=i % len(PROMPTS))
                payload = body(
                    args.served_name, PROMPTS[result.prompt_index], args.max_tokens, stream=True, thinking=args.thinking
                )
                results.append(await stream_one(http, url, payload, result))

        await asyncio.gather(*(one(i) for i in range(n)))
        wall_s = time.perf_counter() - started
    return results, wall_s


def sweep_mode(url: str, mode: str, args) -> tuple[list[dict], dict]:
    refs = asyncio.run(references(url, args))
    levels = []
    for c in args.concurrency:
        results, wall_s = asyncio.run(run_level(url, c, args, seed=c))
        summary = summarize_level(
            results, refs, wall_s=wall_s, requests=requests_at(c, args), max_tokens=args.max_tokens
        )
        held = asyncio.run(slots_after(url))
        level = {"mode": mode, "concurrency": c, **summary}
        level["slots_in_use_after"], level["in_flight_after"] = held["slots_in_use"], held["in_flight"]
        level["passed"] = level_passed(level)
        levels.append(level)
        print(
            f"[{mode} c={c}] {level['completed']}/{level['requests']} complete in {level['duration_s']:.2f} s: "
            f"{level['request_throughput']:.2f} req/s, {level['output_throughput']:.1f} tok/s, "
            f"TTFT p50/p99 {level['p50_ttft_ms']}/{level['p99_ttft_ms']} ms, "
            f"ITL p50/p99 {level['p50_itl_ms']}/{level['p99_itl_ms']} ms; errors {level['errors']}, "
            f"lost {level['lost']}, truncated {level['truncated']}, different {level['different_from_reference']}, "
            f"slots held after {level['slots_in_use_after']:.0f}" + ("" if level["passed"] else "  FAIL"),
            flush=True,
        )
        for message in level["error_messages"]:
            print(f"    error: {message}", flush=True)
    disconnects = asyncio.run(disconnect_phase(url, args)) if args.disconnects else {}
    if disconnects:
        print(
            f"[{mode} disconnects] {disconnects['clients']} hung up: slots in use after "
            f"{disconnects['slots_in_use_after']:.0f}, aborted {disconnects['aborted_on_disconnect']:.0f}, "
            f"freed within {disconnects['freed_within_s']} s",
            flush=True,
        )
    return levels, {"references": refs, "disconnects": disconnects}


def disconnects_passed(check: dict, expected: int) -> bool:
    return not check or (
        check["slots_in_use_after"] == 0
        and check["in_flight_after"] == 0
        and check["aborted_on_disconnect"] == expected
        and check["finished_normally"] == 0
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model for the server subprocess (tiny, smollm2, a path)")
    parser.add_argument(
        "--url", default=None, help="use one running server (loopback only) instead of starting one per mode"
    )
    parser.add_argument("--served-name", default=None, help="the 'model' field to send (default: --model)")
    parser.add_argument("--modes", default="off,auto", help="server --speculation per run, comma-separated")
    parser.add_argument("--concurrency", default="1,4,16,64", help="clients in flight per level, comma-separated")
    parser.add_argument("--min-requests", type=int, default=16, help="requests per level: max(2 x concurrency, this)")
    parser.add_argument(
        "--request-rate", type=float, default=None, help="Poisson arrivals (req/s) instead of a closed loop"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--thinking", action="store_true", help="ask for thinking (selfspec.thinking: true)")
    parser.add_argument("--disconnects", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=400, help="max_tokens of the streams that hang up")
    parser.add_argument("--num-slots", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=None)
    parser.add_argument("--device", default="auto", help="server --device")
    parser.add_argument("--dtype", default="auto", help="server --dtype")
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--out-dir", type=Path, default=None, help="write results.json, README.md and a plot here")
    args = parser.parse_args(argv)
    args.served_name = args.served_name or args.model
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if any(c < 1 for c in args.concurrency):
        parser.error("--concurrency: every level must be at least 1")
    if args.request_rate is not None and args.request_rate <= 0:
        parser.error("--request-rate must be positive")
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        parser.error("--url must be a loopback address (127.0.0.1, localhost, ::1)")
    if args.url and len(args.modes) > 1:
        parser.error("--url serves one mode: pass --modes with the running server's mode only")
    args.load_before = round(os.getloadavg()[0], 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels, disconnects, refs_by_mode = [], {}, {}
    for mode in args.modes:
        process, url = (None, args.url) if args.url else start_server(args, mode)
        try:
            mode_levels, extra = sweep_mode(url, mode, args)
        finally:
            if process is not None:
                stop_server(process)
        levels += mode_levels
        disconnects[mode] = extra["disconnects"]
        refs_by_mode[mode] = extra["references"]
    ref_sets = list(refs_by_mode.values())
    passed = all(level["passed"] for level in levels) and all(
        disconnects_passed(check, args.disconnects) for check in disconnects.values()
    )
    result = {
        **output.run_header(args),
        "levels": levels,
        "disconnects": disconnects,
        "references_equal_across_modes": all(r == ref_sets[0] for r in ref_sets),
        "passed": passed,
    }
    if args.out_dir:
        output.write(args.out_dir, result)
        print(f"wrote {args.out_dir}/results.json, README.md, throughput_ttft.png")
    print(json.dumps({"passed": passed, "references_equal_across_modes": result["references_equal_across_modes"]}))
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
