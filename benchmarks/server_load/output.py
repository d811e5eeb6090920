"""What a sweep writes under `--out-dir`: results.json (every level x mode, the command, the device,
the versions, the date), README.md (a table per model) and a plot of output tokens/s and TTFT p99
against concurrency, one line per mode."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path

COLUMNS = [
    ("mode", "mode"),
    ("concurrency", "concurrency"),
    ("req/s", "request_throughput"),
    ("output tok/s", "output_throughput"),
    ("TTFT p50 ms", "p50_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"),
    ("ITL p50 ms", "p50_itl_ms"),
    ("ITL p99 ms", "p99_itl_ms"),
    ("e2e p50 ms", "p50_e2el_ms"),
    ("e2e p99 ms", "p99_e2el_ms"),
    ("errors", "errors"),
    ("lost", "lost"),
]


def device_name(device: str) -> str:
    """The GPU's name when the server ran on CUDA, else the CPU's model name and core count."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({os.cpu_count()} cores)"


def run_header(args) -> dict:
    from selfspec.run_info import library_versions

    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(args.device),
        "versions": library_versions(),
        "settings": {
            "model": args.model,
            "modes": args.modes,
            "concurrency": args.concurrency,
            "request_rate": args.request_rate,
            "max_tokens": args.max_tokens,
            "thinking": args.thinking,
            "num_slots": args.num_slots,
            "server_device": args.device,
            "dtype": args.dtype,
            "load_average_1m_before": args.load_before,
        },
    }


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    return str(value)


def markdown_table(levels: list[dict]) -> str:
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for level in levels:
        lines.append("| " + " | ".join(_cell(level.get(key)) for _, key in COLUMNS) + " |")
    return "\n".join(lines)


def readme(result: dict) -> str:
    header, settings = result, result["settings"]
    versions = ", ".join(f"{k} {v}" for k, v in header["versions"].items())
    verdict = "PASS" if result["passed"] else "FAIL"
    rate = f"Poisson arrivals at {settings['request_rate']} req/s" if settings["request_rate"] else "closed loop"
    parts = [
        f"# Server load: {settings['model']}",
        "",
        f"`{header['command']}`",
        "",
        f"Device: {header['device']}; server `--device {settings['server_device']} --dtype {settings['dtype']}`, "
        f"{settings['num_slots']} slots; {rate}; max_tokens {settings['max_tokens']}, "
        f"thinking {'on' if settings['thinking'] else 'off'}; load average (1 min) before: "
        f"{settings['load_average_1m_before']}. Versions: {versions}. Date: {header['date']}. Verdict: {verdict}.",
        "",
        f"## {settings['model']}",
        "",
        markdown_table(result["levels"]),
        "",
        "Times in ms. ITL is per token (a chunk's gap over its request's tokens per chunk); "
        "errors and lost include requests that never returned.",
    ]
    for mode, check in result.get("disconnects", {}).items():
        parts.append(
            f"\nDisconnects ({mode}): {check['clients']} clients hung up mid-stream; slots in use after "
            f"{check['slots_in_use_after']:.0f}, aborted on disconnect {check['aborted_on_disconnect']:.0f}, "
            f"freed within {check['freed_within_s']} s."
        )
    return "\n".join(parts) + "\n"


def plot(levels: list[dict], path: Path, title: str) -> None:
    """Output tok/s and TTFT p99 against concurrency, one line per mode (log-2 x axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in dict.fromkeys(level["mode"] for level in levels):
        rows = [level for level in levels if level["mode"] == mode]
        xs = [row["concurrency"] for row in rows]
        left.plot(xs, [row["output_throughput"] for row in rows], marker="o", label=mode)
        right.plot(xs, [row["p99_ttft_ms"] or float("nan") for row in rows], marker="o", label=mode)
    for axis, label in ((left, "output tokens/s"), (right, "TTFT p99 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrency")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend(title="speculation")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(out_dir: Path, result: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "README.md").write_text(readme(result))
    plot(result["levels"], out_dir / "throughput_ttft.png", f"{result['settings']['model']} on {result['device']}")
