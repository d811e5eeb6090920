"""Where each mode's time went: forwards on the device, the host between them, and by what.

Why: a speculative mode can save forwards and lose the saving again in the host's part of each
step (on an H100 a 135M model's forward is ~1.4 ms and the engine's Python around it 0.05-0.2
ms), and a latency table cannot tell the two apart. Records with a forward schedule carry the
forward and host seconds of their request; records of this engine also carry the host's part
of each step by phase (`host_ms`: propose, commit, policies, outside; `engine.host_phases`) and
each gap between forwards longer than 5 ms (`schedule.stalls`). This sums them per mode. A batched
run's one schedule (`batch_schedule`, on the batch's first record, with that batch's phases) counts
like a request's: per forward, the device time and the host time of the whole batch's steps.
"""

from __future__ import annotations

from typing import Any

from selfspec.engine.host_phases import PHASES, ROW_GROUPS
from selfspec_bench.records import Group, mode_order
from selfspec_bench.tables import markdown


def host_split(group: Group) -> dict[str, dict[str, Any]]:
    """Per mode over its records with a schedule: forwards, ms per forward on the device and
    between forwards, the phases' ms per step (weighted by forwards), and the stalls (count,
    longest in ms). Empty when no record has a schedule."""
    sums: dict[str, dict[str, Any]] = {}
    for r in group.records:
        schedule = r.get("schedule") or r.get("batch_schedule")
        if not isinstance(schedule, dict) or not schedule.get("forwards"):
            continue
        s = sums.setdefault(
            r["mode"],
            {
                "forwards": 0,
                "gpu_s": 0.0,
                "host_s": 0.0,
                "phased": 0,
                "phases": dict.fromkeys(PHASES, 0.0),
                "stalls": [],
                "by_rows": {},
            },
        )
        n = int(schedule["forwards"])
        s["forwards"] += n
        s["gpu_s"] += float(schedule.get("gpu_s", 0.0))
        s["host_s"] += float(schedule.get("host_s", 0.0))
        phases = r.get("host_ms") or {}
        if all(p in phases for p in PHASES):
            s["phased"] += n
            for p in PHASES:
                s["phases"][p] += phases[p] * n
        s["stalls"].extend(ms for _, ms in schedule.get("stalls", []))
        for group, figures in (r.get("host_ms_by_rows") or {}).items():
            acc = s["by_rows"].setdefault(group, {"steps": 0, **dict.fromkeys(PHASES, 0.0)})
            steps = int(figures.get("steps", 0))
            acc["steps"] += steps
            for p in PHASES:
                acc[p] += figures.get(p, 0.0) * steps
    out: dict[str, dict[str, Any]] = {}
    for mode in mode_order(sums):
        s = sums[mode]
        n, stalls = s["forwards"], s["stalls"]
        out[mode] = {
            "forwards": n,
            "gpu_ms_per_forward": 1000 * s["gpu_s"] / n,
            "host_ms_per_forward": 1000 * s["host_s"] / n,
            "phases_ms": {p: s["phases"][p] / s["phased"] for p in PHASES} if s["phased"] else None,
            "stalls": len(stalls),
            "longest_stall_ms": max(stalls, default=None),
            "by_rows": {
                group: {"steps": acc["steps"], **{p: acc[p] / acc["steps"] for p in PHASES}}
                for group in ROW_GROUPS
                if (acc := s["by_rows"].get(group)) and acc["steps"]
            },
        }
    return out


def host_lines(split: dict[str, dict[str, Any]]) -> list[str]:
    """`host_split` as a table, or nothing without schedules."""
    if not split:
        return []
    rows = []
    for mode, s in split.items():
        phases = s["phases_ms"]
        rows.append(
            [
                mode,
                s["forwards"],
                f"{s['gpu_ms_per_forward']:.3f}",
                f"{s['host_ms_per_forward']:.3f}",
                *(f"{phases[p]:.3f}" if phases else "–" for p in PHASES),
                s["stalls"],
                "–" if s["longest_stall_ms"] is None else f"{s['longest_stall_ms']:.1f}",
            ]
        )
    return [
        "### Device and host time per forward",
        "",
        "Sums over each mode's records: forward time on the device and the host's time between forwards, per forward; "
        "the host's part of a step by phase (propose: scheduling and proposals; commit: verification and commits; "
        "policies: the methods' bookkeeping, drafts forked or judged; outside: the caller's loop); gaps over 5 ms "
        "between two forwards (stalls) and the longest.",
        "",
        markdown(
            ["mode", "forwards", "device ms", "host ms", *(f"{p} ms" for p in PHASES), "stalls", "longest stall ms"],
            rows,
        ),
        "",
        *_by_rows_lines(split),
    ]


def _by_rows_lines(split: dict[str, dict[str, Any]]) -> list[str]:
    """The host's part of a step by the rows the step fed, where records carry it: a drafting
    request's steps with its draft beside it against its steps alone."""
    rows = [
        [
            mode,
            group,
            figures["steps"],
            f"{sum(figures[p] for p in PHASES):.3f}",
            *(f"{figures[p]:.3f}" for p in PHASES),
        ]
        for mode, s in split.items()
        for group, figures in s.get("by_rows", {}).items()
    ]
    if not rows:
        return []
    return [
        "The host's part of a step by the rows the step fed (a drafting request's draft is its second row; "
        "steps of every record of the mode, ms per step):",
        "",
        markdown(["mode", "rows", "steps", "host ms", *(f"{p} ms" for p in PHASES)], rows),
        "",
    ]
