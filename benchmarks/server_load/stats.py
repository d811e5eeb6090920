"""The figures of one level (one concurrency, one server mode), as vLLM's benchmark_serving defines them.

- TTFT: request sent -> first streamed content (or reasoning) chunk.
- ITL: the gap between consecutive content chunks, per token. A chunk may carry several tokens
  (speculation accepts them together, and the detokenizer may hold back a partial character), and
  the stream does not say how many, so each gap is divided by the request's mean tokens per chunk
  (usage's completion_tokens / chunks): with one token per chunk it is the plain chunk gap.
- TPOT: (end-to-end latency - TTFT) / (completion_tokens - 1), per request.
- Output token throughput: the completion tokens from usage of every complete request / the level's wall time.
"""

from __future__ import annotations

import numpy as np

from .clients import StreamResult


def percentiles(values: list[float], name: str, unit_scale: float = 1000.0) -> dict[str, float | None]:
    """mean / p50 / p99 of `values` in ms (nearest rank: each an observed value); None when nothing completed."""
    if not values:
        return {f"mean_{name}_ms": None, f"p50_{name}_ms": None, f"p99_{name}_ms": None}
    p50, p99 = np.percentile(values, [50, 99], method="nearest")
    return {
        f"mean_{name}_ms": round(float(np.mean(values)) * unit_scale, 3),
        f"p50_{name}_ms": round(float(p50) * unit_scale, 3),
        f"p99_{name}_ms": round(float(p99) * unit_scale, 3),
    }


def per_token_itls(result: StreamResult) -> list[float]:
    """The request's chunk gaps, each divided by its mean tokens per chunk (see the module's docstring)."""
    if result.chunks < 2 or not result.completion_tokens:
        return []
    tokens_per_chunk = max(result.completion_tokens / result.chunks, 1.0)
    times = result.chunk_times
    return [(b - a) / tokens_per_chunk for a, b in zip(times, times[1:])]


def summarize_level(
    results: list[StreamResult], refs: list[tuple[str, int]], *, wall_s: float, requests: int, max_tokens: int
) -> dict:
    """Counts (complete, errors, lost, truncated, different from the reference) and the latency figures."""
    errored = [r for r in results if r.error]
    lost = [r for r in results if not r.error and not r.saw_done]
    truncated = [
        r
        for r in results
        if not r.error
        and r.saw_done
        and (
            r.finish_reason is None
            or r.completion_tokens is None
            or (r.finish_reason == "length" and r.completion_tokens != max_tokens)
        )
    ]
    complete = [r for r in results if r.ok and r not in truncated]
    different = [r for r in complete if (r.text, r.completion_tokens) != refs[r.prompt_index]]
    tokens = sum(r.completion_tokens for r in complete)
    tpots = [(r.latency - r.ttft) / (r.completion_tokens - 1) for r in complete if r.completion_tokens > 1 and r.ttft]
    chunks = sum(r.chunks for r in complete)
    summary = {
        "requests": requests,
        "sent": len(results),
        "completed": len(complete),
        "errors": len(errored),
        "lost": len(lost) + (requests - len(results)),
        "truncated": len(truncated),
        "different_from_reference": len(different),
        "duration_s": round(wall_s, 3),
        "request_throughput": round(len(complete) / wall_s, 3) if wall_s else 0.0,
        "completion_tokens": tokens,
        "output_throughput": round(tokens / wall_s, 2) if wall_s else 0.0,
        "tokens_per_chunk": round(tokens / chunks, 3) if chunks else None,
        **percentiles([r.ttft for r in complete if r.ttft is not None], "ttft"),
        **percentiles([x for r in complete for x in per_token_itls(r)], "itl"),
        **percentiles(tpots, "tpot"),
        **percentiles([r.latency for r in complete], "e2el"),
        "error_messages": sorted({r.error for r in errored})[:5],
    }
    return summary


def level_passed(summary: dict) -> bool:
    """Every request sent came back whole, on time and equal to its reference; no slot left held."""
    return (
        summary["completed"] == summary["requests"]
        and not summary["errors"]
        and not summary["lost"]
        and not summary["truncated"]
        and not summary["different_from_reference"]
        and summary.get("slots_in_use_after", 0) == 0
        and summary.get("in_flight_after", 0) == 0
    )
