"""Files of a CoSpec eval: results.jsonl, report.md and the speed–score curve (PNG).

The report keeps the lossy rows visibly apart: every CoSpec row is labelled LOSSY in the
table and carries `lossy: true` in the JSONL, so a speedup can never be read as if it came
with the target's exact output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from selfspec_research.cospec.evaluate import CoSpecEvalResults

RESULTS_FILE = "results.jsonl"
REPORT_FILE = "report.md"
PLOT_FILE = "speed_score.png"


def _fmt(value: Any, pattern: str = "{:.3f}") -> str:
    return "–" if value is None else pattern.format(value)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _mode_name(row: dict[str, Any]) -> str:
    if row["mode"] == "target":
        return "target only"
    if row["mode"] == "sps":
        return f"SpS K={row['k']} (lossless)" if row.get("k") else "SpS (lossless)"
    if row["mode"] == "draft":
        return "draft model alone (not the target)"
    return f"CoSpec λ={row['threshold']:g} **LOSSY**"


def _complementarity_line(row: dict[str, Any]) -> str:
    """What CoSpec's score could gain: items the draft alone solves and the target does not."""
    n = row["items"]
    parts = [
        f"Complementarity over {n} items: target solves {row['target_solved']}, the draft alone {row['draft_solved']}; "
        f"solved by the draft but not the target: **{row['draft_not_target']}**; by the target but not the draft: "
        f"{row['target_not_draft']}; oracle union {row['union']}/{n}."
    ]
    for label, c in row.get("cospec", {}).items():
        parts.append(
            f"{label.replace('cospec@', 'CoSpec λ=')}: solves {c['solved']}, {c['beyond_target']} beyond the target, "
            f"{c['lost_vs_target']} the target solved lost."
        )
    return " ".join(parts)


def _arbitrator_line(meta: dict[str, Any]) -> str:
    if not meta.get("with_arbitrator"):
        return "none (target-only and SpS rows only)"
    config = meta.get("arbitrator_config") or {}
    lora = config.get("lora") or {}
    facts = f" (LoRA r {lora['r']}, α {lora['alpha']}; trained on draft {config.get('draft')!r})" if lora else ""
    return f"`{meta.get('arbitrator') or 'in memory'}`{facts}"


def _device_suffix(meta: dict) -> str:
    name = meta.get("device_name")
    return f" ({name})" if name and name != meta.get("device") else ""


def _versions_line(versions: dict) -> str:
    return "; ".join(f"{k} {v}" for k, v in versions.items())


def render_markdown(results: CoSpecEvalResults) -> str:
    """One table per task (score, speed, τ, kept tokens) and the counterfactual agreement."""
    cfg, meta = results.config, results.meta
    lines = [
        f"# CoSpec eval: `{meta.get('model', '?')}` (draft `{meta.get('draft', '?')}`)",
        "",
        "CoSpec rows are **LOSSY**: the arbitrator may keep a draft token the target would not have chosen, so "
        "their outputs differ from the target's greedy output. Target-only and SpS rows are lossless "
        "(`same as target` checks it token for token).",
        "",
        f"- tasks: {', '.join(cfg['tasks'])}; {cfg['n']} held-out items each (seed {cfg['seed']})",
        f"- K = {cfg['k']} draft tokens per round; max tokens {cfg['max_tokens']}; greedy; batch 1, modes interleaved per item",
        f"- arbitrator: {_arbitrator_line(meta)}",
        f"- device: {meta.get('device', '?')}{_device_suffix(meta)}, dtype {meta.get('dtype', '?')}",
        *([f"- versions: {_versions_line(meta['versions'])}"] if meta.get("versions") else []),
        "",
        "Speedup: target-only total latency / the mode's total latency on the same items. τ: output tokens per "
        "target decode forward (`accepted_per_forward` in results.jsonl: without the target's own token). Acceptance: accepted / proposed draft tokens. Kept: draft tokens kept by the "
        "arbitrator at mismatches. CoSpec at λ = 1 keeps nothing (the SpS tokens) but still runs the arbitrator at "
        "every first mismatch: its speed next to SpS is the arbitrator's overhead.",
    ]
    tasks = list(dict.fromkeys(row["task"] for row in results.summaries))
    for task in tasks:
        lines += [
            "",
            f"## {task}",
            "",
            "| mode | lossy | accuracy | mean score | mean latency (s) | speedup | tok/s | τ | acceptance | kept draft tokens | arbitrations | same as target |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for row in (r for r in results.summaries if r["task"] == task):
            lines.append(
                f"| {_mode_name(row)} | {'yes' if row['lossy'] else 'no'} | {_pct(row['accuracy'])} | {_fmt(row['mean_score'])} | "
                f"{_fmt(row['mean_latency_s'])} | {_fmt(row['speedup'], '{:.2f}x')} | {_fmt(row['tokens_per_s'], '{:.1f}')} | "
                f"{_fmt(row['tau'], '{:.2f}')} | {_pct(row['acceptance'])} | {row['kept_draft_tokens']} | {row['arbitrations']} | "
                f"{_pct(row['same_as_target'])} |"
            )
        for c in (r for r in results.complementarity if r["task"] == task):
            lines += ["", _complementarity_line(c)]
        cf = [r for r in results.counterfactual_summaries if r["task"] == task]
        if cf:
            first = cf[0]
            lines += [
                "",
                f"Counterfactual agreement ({first['states']} sampled mismatch states on the SpS path, "
                f"{first['decisive_states']} decisive; draft branch better in {first['draft_branch_better']}, "
                f"target branch better in {first['target_branch_better']}):",
                "",
                "| λ | kept share | agreement (all states) | agreement (decisive states) |",
                "| --- | --- | --- | --- |",
            ]
            for row in cf:
                lines.append(
                    f"| {row['threshold']:g} | {_pct(row['kept_share'])} | {_pct(row['agreement'])} | {_pct(row['decisive_agreement'])} |"
                )
    lines += [
        "",
        "Counterfactual agreement: at a mismatch state both branches (draft token / target token) are continued "
        "greedily by the target to the same budget and scored; the arbitrator's choice at λ (keep iff π ≥ λ) agrees "
        "when its branch scores at least as well as the other. Decisive states: the branches score differently.",
        "",
        f"![speed vs score]({PLOT_FILE})",
    ]
    if meta.get("command"):
        lines += ["", "Command:", "", "```", meta["command"], "```"]
    return "\n".join(lines) + "\n"


def plot_speed_score(results: CoSpecEvalResults, path: str | Path) -> Path:
    """Mean score against speedup per task: target and SpS points, the CoSpec curve over λ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(row["task"] for row in results.summaries)) or ["(none)"]
    cols = min(3, len(tasks))
    rows = (len(tasks) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 4.0 * rows), squeeze=False)
    for axis, task in zip(axes.flat, tasks):
        summary = [r for r in results.summaries if r["task"] == task]
        other_k = 0  # staggered labels: SpS points at nearby speedups would print over each other
        for row in summary:
            x, y = row["speedup"] or 0.0, row["mean_score"] or 0.0
            if row["mode"] == "target":
                axis.scatter([x], [y], marker="o", color="black", zorder=3, label="target only")
            elif row["mode"] == "sps":
                axis.scatter(
                    [x],
                    [y],
                    marker="s",
                    color="tab:blue" if not row.get("k") else "tab:cyan",
                    zorder=3,
                    label=f"SpS K={results.config.get('k', '?')} (lossless)"
                    if not row.get("k")
                    else "SpS at other K (lossless)",
                )
                if row.get("k"):
                    axis.annotate(
                        f"K={row['k']}",
                        (x, y),
                        textcoords="offset points",
                        xytext=(0, -12 - 9 * (other_k % 3)),
                        ha="center",
                        fontsize=7,
                    )
                    other_k += 1
            elif row["mode"] == "draft":
                axis.scatter([x], [y], marker="x", color="tab:gray", zorder=3, label="draft alone")
        cospec = sorted((r for r in summary if r["mode"] == "cospec"), key=lambda r: r["threshold"])
        if cospec:
            xs = [r["speedup"] or 0.0 for r in cospec]
            ys = [r["mean_score"] or 0.0 for r in cospec]
            axis.plot(xs, ys, marker="^", color="tab:red", label="CoSpec (LOSSY)")
            for index, (r, x, y) in enumerate(zip(cospec, xs, ys)):
                axis.annotate(
                    f"λ={r['threshold']:g}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 4 + 9 * (index % 3)),
                    fontsize=7,
                )
        axis.set_title(task, fontsize=10)
        axis.set_xlabel("speedup vs target-only (latency)")
        axis.set_ylabel("mean score")
        axis.set_ylim(-0.05, 1.05)
        axis.grid(alpha=0.3)
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one entry per kind of point
        axis.legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    for axis in list(axes.flat)[len(tasks) :]:
        axis.axis("off")
    fig.suptitle(f"CoSpec speed–score: {results.meta.get('model', '?')}", fontsize=11)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def write_jsonl(lines: Sequence[dict[str, Any]], path: str | Path) -> Path:
    target = Path(path)
    with target.open("w") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    return target


def write_outputs(results: CoSpecEvalResults, out_dir: str | Path) -> list[Path]:
    """results.jsonl, report.md and speed_score.png under `out_dir`."""
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    paths = [write_jsonl(results.lines(), target / RESULTS_FILE)]
    (target / REPORT_FILE).write_text(render_markdown(results))
    paths.append(target / REPORT_FILE)
    paths.append(plot_speed_score(results, target / PLOT_FILE))
    return paths


__all__ = ["PLOT_FILE", "REPORT_FILE", "RESULTS_FILE", "plot_speed_score", "render_markdown", "write_outputs"]


def merge_results(paths: Sequence[str | Path]) -> CoSpecEvalResults:
    """One `CoSpecEvalResults` from several eval runs' results.jsonl (e.g. tasks split over two
    GPUs). Runs must share model, draft, arbitrator, K and thresholds: their rows sit in one
    report. Raises ValueError naming the file that differs or is not an eval result."""
    merged: CoSpecEvalResults | None = None
    commands: list[str] = []
    same = ("model", "draft", "arbitrator", "dtype")
    for path in paths:
        lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        if not lines or lines[0].get("kind") != "config":
            raise ValueError(f"{path}: not a `selfspec cospec eval` results.jsonl (no config line first)")
        head = dict(lines[0])
        config = head.pop("config")
        head.pop("kind")
        if merged is None:
            merged = CoSpecEvalResults(config=dict(config), meta=head)
        else:
            for key in same:
                if head.get(key) != merged.meta.get(key):
                    raise ValueError(f"{path}: {key} {head.get(key)!r} differs from {merged.meta.get(key)!r}")
            for key in ("k", "thresholds", "max_tokens"):
                if config.get(key) != merged.config.get(key):
                    raise ValueError(
                        f"{path}: config {key} {config.get(key)!r} differs from {merged.config.get(key)!r}"
                    )
            merged.config["tasks"] = list(dict.fromkeys([*merged.config["tasks"], *config["tasks"]]))
        if head.get("command"):
            commands.append(head["command"])
        for line in lines[1:]:
            bucket = {
                "item": merged.items,
                "summary": merged.summaries,
                "counterfactual": merged.counterfactual_states,
                "counterfactual_summary": merged.counterfactual_summaries,
                "complementarity": merged.complementarity,
            }.get(line.get("kind"))
            if bucket is not None:
                bucket.append(line)
    if merged is None:
        raise ValueError("no results files given")
    merged.meta["command"] = "\n".join(commands)
    return merged
