"""PNG plots for `selfspec bench report` (matplotlib, Agg backend: no display needed).

Two pictures answer the two questions a reader has: *where does the time go* (CoT vs
answer, per mode — SSR can only shorten the answer part), and *how does the draft budget
move the speedup* (earlier drafts are cheaper to hide but see less of the CoT).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

from selfspec_bench.modes import SSR_MODES

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

COT_COLOR, ANSWER_COLOR, TOTAL_COLOR = "#4C72B0", "#DD8452", "#8C8C8C"
# Modes whose work depends on the draft budget; the others are references on the budget plot.
DRAFT_MODES = (*SSR_MODES, "ssr-off")


def plot_latency_split(title: str, table: dict[str, dict[str, Any]], path: Path) -> Path:
    """Stacked bars per mode: mean CoT time (thinking_s) under mean answer time (latency − thinking).

    Modes without a CoT/answer split (transformers `generate`) get one hatched bar of their
    total latency. Each bar is labelled with its total and its paired speedup.
    """
    modes = list(table)
    most_samples = max((s["n"] for s in table.values()), default=0)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(modes) + 2), 4.5))
    for x, mode in enumerate(modes):
        s = table[mode]
        total = s["mean_latency_s"] or 0.0
        if s["mean_thinking_s"] is not None and s["mean_answer_s"] is not None:
            ax.bar(
                x, s["mean_thinking_s"], color=COT_COLOR, label="CoT (thinking)" if x == _first_split(table) else None
            )
            ax.bar(
                x,
                s["mean_answer_s"],
                bottom=s["mean_thinking_s"],
                color=ANSWER_COLOR,
                label="answer" if x == _first_split(table) else None,
            )
        else:
            ax.bar(
                x,
                total,
                color=TOTAL_COLOR,
                hatch="//",
                edgecolor="white",
                label="total (no CoT/answer split)" if x == _first_total(table) else None,
            )
        speedup = s["speedup"]
        text = f"{total:.3g}s" + (f"\n{speedup:.2f}x" if speedup is not None else "")
        if s["n"] != most_samples:  # a partial run: this bar averages fewer samples
            text += f"\nn={s['n']}"
        ax.annotate(
            text,
            (x, total),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            va="bottom",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
        )
    baseline = table.get("baseline", {}).get("mean_latency_s")
    if baseline:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=0.8, label="baseline latency")
    ax.set_xticks(range(len(modes)), modes, rotation=25, ha="right")
    ax.set_ylabel("mean latency per sample (s)")
    ax.set_title(f"{title}: where the time goes (label: total, speedup vs baseline)", fontsize=10)
    ax.set_ylim(0, max((table[m]["mean_latency_s"] or 0.0) for m in modes) * 1.3 or 1.0)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, frameon=False)
    return _save(fig, path)


def plot_speedup_vs_budget(
    title: str,
    series: dict[str, list[tuple[float, float]]],
    series_no_loops: dict[str, list[tuple[float, float]]],
    path: Path,
) -> Path:
    """Paired speedup against draft budget, one line per mode; a second panel without loop samples.

    The second panel is drawn only when it differs from the first (some baseline looped).
    A single budget still draws one marker per mode, so the file always exists.
    """
    colors = _mode_colors([*series, *series_no_loops])  # one colour per mode in both panels
    panels = [("all samples", series)]
    if series_no_loops != series:
        panels.append(("excluding baseline loops", series_no_loops))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, (label, data) in zip(axes[0], panels):
        budgets: set[float] = set()
        for mode, points in data.items():
            xs, ys = zip(*points) if points else ((), ())
            budgets.update(xs)
            if mode in DRAFT_MODES:
                ax.plot(xs, ys, marker="o", color=colors[mode], label=mode)
            else:  # no draft: the budget does not touch it, so draw it as a reference
                ax.plot(xs, ys, marker="x", linestyle=":", linewidth=1, color=colors[mode], label=f"{mode} (no draft)")
        if budgets:
            ax.set_xticks(sorted(budgets), [f"{b:g}" for b in sorted(budgets)])
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_xlabel("draft budget (CoT tokens before the fork)")
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        if not data:
            ax.set_xticks([])
            ax.text(
                0.5, 0.5, "no samples left to pair with a baseline", ha="center", va="center", transform=ax.transAxes
            )
    axes[0][0].set_ylabel("speedup vs baseline (paired mean)")
    handles, labels = {}, []
    for ax in axes[0]:  # a mode may appear in one panel only
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    handles, labels = list(handles.values()), list(handles)
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False)
    fig.suptitle(f"{title}: speedup against draft budget", fontsize=10)
    return _save(fig, path)


def _mode_colors(modes: list[str]) -> dict[str, Any]:
    palette = plt.get_cmap("tab10").colors
    return {mode: palette[i % len(palette)] for i, mode in enumerate(dict.fromkeys(modes))}


def _first_split(table: dict[str, dict[str, Any]]) -> int | None:
    return next(
        (
            i
            for i, s in enumerate(table.values())
            if s["mean_thinking_s"] is not None and s["mean_answer_s"] is not None
        ),
        None,
    )


def _first_total(table: dict[str, dict[str, Any]]) -> int | None:
    return next(
        (i for i, s in enumerate(table.values()) if s["mean_thinking_s"] is None or s["mean_answer_s"] is None), None
    )


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # "tight" keeps legends placed outside the axes
    plt.close(fig)
    return path
