"""Total throughput of a batched run: output tokens per second of wall time, per mode.

Why: under load a server is judged by what the whole batch delivers, not only by each request's
latency; a speculative mode that shortens some requests' latency while its extra rows slow every
step can lose throughput, and the per-request speedups of the mode table cannot show that. A
batched run (`--concurrency N`) submits each group of N samples at once; its records carry the
group's index (`batch`) and the time from the group's submission to its last request's end
(`batch_wall_s`). Throughput = the mode's output tokens over the sum of its batches' wall times.
Records written before those fields existed: a mode whose records fit one batch (no more of them
than the concurrency) counts the longest request latency as the batch's wall time; otherwise the
mode is left out (its batches cannot be told apart).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from selfspec_bench.peers import PEER_MODES
from selfspec_bench.records import BASELINE, Group, mode_order
from selfspec_bench.tables import fmt, markdown


def _batches(records: list[dict[str, Any]], concurrency: int) -> dict[Any, list[dict[str, Any]]] | None:
    """The mode's records by batch; None where older records of several batches cannot be told apart."""
    if all("batch" in r for r in records):
        out: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            out[r["batch"]].append(r)
        return out
    return {0: records} if len(records) <= concurrency else None


def _wall(batch: list[dict[str, Any]]) -> float | None:
    walls = [r["batch_wall_s"] for r in batch if r.get("batch_wall_s")]
    if walls:
        return max(walls)
    latencies = [r["latency_s"] for r in batch if r.get("latency_s")]
    return max(latencies) if latencies else None


def batch_throughput(group: Group) -> dict[str, dict[str, Any]]:
    """Per mode of a batched run (concurrency > 1): requests, batches, output tokens, wall seconds,
    tokens per second, and the ratio to the baseline's and to the best peer's tokens per second.
    Empty for runs of one request at a time."""
    concurrency = int(group.settings.get("concurrency", 1) or 1)
    if concurrency <= 1:
        return {}
    by_mode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in group.records:
        if r.get("mode") and r.get("output_tokens") is not None:
            by_mode[r["mode"]].append(r)
    out: dict[str, dict[str, Any]] = {}
    for mode in mode_order(by_mode):
        batches = _batches(by_mode[mode], concurrency)
        if batches is None:
            continue
        walls = [_wall(b) for b in batches.values()]
        if any(w is None for w in walls):
            continue
        tokens = sum(int(r["output_tokens"]) for r in by_mode[mode])
        wall = float(sum(walls))
        out[mode] = {
            "requests": len(by_mode[mode]),
            "batches": len(batches),
            "output_tokens": tokens,
            "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else None,
        }
    base = out.get(BASELINE, {}).get("tokens_per_s")
    peers = [(m, out[m]["tokens_per_s"]) for m in PEER_MODES if m in out and out[m]["tokens_per_s"]]
    best_peer = max(peers, key=lambda p: p[1]) if peers else None
    for mode, row in out.items():
        rate = row["tokens_per_s"]
        row["vs_baseline"] = rate / base if rate and base else None
        row["vs_best_peer"] = rate / best_peer[1] if rate and best_peer and mode not in PEER_MODES else None
        row["best_peer"] = best_peer[0] if best_peer else None
    return out


def throughput_lines(table: dict[str, dict[str, Any]]) -> list[str]:
    """`batch_throughput` as a markdown section, or nothing."""
    if not table:
        return []
    best = next((row["best_peer"] for row in table.values() if row.get("best_peer")), None)
    rows = [
        [
            mode,
            str(row["requests"]),
            str(row["batches"]),
            str(row["output_tokens"]),
            fmt(row["wall_s"], ".2f"),
            fmt(row["tokens_per_s"], ".1f"),
            fmt(row["vs_baseline"], ".3f", "x"),
            fmt(row["vs_best_peer"], ".3f", "x"),
        ]
        for mode, row in table.items()
    ]
    return [
        "### Throughput under load",
        "",
        "Output tokens of every request over the summed wall time of the run's batches (each group of "
        "`concurrency` requests submitted at once, timed from submission to its last request's end)"
        + (f"; the best peer by throughput: {best}." if best else "."),
        "",
        markdown(
            ["mode", "requests", "batches", "output tokens", "wall s", "tokens/s", "vs baseline", "vs best peer"],
            rows,
        ),
        "",
    ]
