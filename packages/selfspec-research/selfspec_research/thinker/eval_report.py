"""The thinker eval's files: results.json, report.md (tables, the computed acceptance checks,
the shortfalls) and convergence.png.

The acceptance checks are computed from the results, never asserted by hand: at least
three families at 70% accuracy or more, thinking closed by the model and the answer
ended at EOS in 95% of runs, no loops, a convergence curve that rises with the fork
point, and at least a third of the final answer predictable from a draft at 50% of the
CoT.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from selfspec_bench.records import model_label
from selfspec_research.thinker.measures import LOOP_MIN_REPEATS, LOOP_MIN_SPAN

ACCURACY_TARGET = 0.70
SELF_STOP_TARGET = 0.95
PREDICTABLE_AT_HALF_TARGET = 1 / 3


def check_targets(results: dict[str, Any]) -> dict[str, Any]:
    """The acceptance checks (module doc), computed from the results (never asserted by hand)."""
    families = results["families"]
    strong = [f for f, s in families.items() if (s["accuracy"] or 0) >= ACCURACY_TARGET]
    overall = results["overall"]
    table = results["convergence"]["overall"]
    shares = [table[key]["predictable_share"] for key in sorted(table) if table[key]["predictable_share"] is not None]
    half = table.get("0.50", {}).get("predictable_share")
    # The same curve with each draft cut to its final answer's length: early drafts that
    # ramble to the draft cap otherwise inflate the early points (lookup over a longer text).
    capped = [table[key].get("predictable_share_capped") for key in sorted(table)]
    capped = [c for c in capped if c is not None]
    half_capped = table.get("0.50", {}).get("predictable_share_capped")
    # The fork points proper (10-90% of the CoT), without the prompt-only 0% reference: a model can
    # answer well from the prompt alone and still converge as it thinks.
    forked = [
        table[key]["predictable_share"]
        for key in sorted(table)
        if float(key) > 0 and table[key]["predictable_share"] is not None
    ]
    return {
        "families_at_or_above_70pct": strong,
        "accuracy_ok": len(strong) >= 3,
        "self_stopped_ok": (overall["self_stopped"] or 0) >= SELF_STOP_TARGET,
        "no_loops": overall["loops"] == 0,
        "curve_rises": bool(shares) and all(b >= a for a, b in zip(shares, shares[1:])),
        "predictable_at_half": half,
        "predictable_at_half_ok": half is not None and half >= PREDICTABLE_AT_HALF_TARGET,
        "curve_rises_capped": bool(capped) and all(b >= a for a, b in zip(capped, capped[1:])),
        "curve_rises_after_forking": bool(forked) and all(b >= a for a, b in zip(forked, forked[1:])),
        "predictable_at_half_capped": half_capped,
    }


# --------------------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def render_markdown(
    results: dict[str, Any], training: Mapping[str, Any] | None = None, notes: str | None = None
) -> str:
    """The eval report: training facts, accuracy table, convergence table, shortfalls,
    then `notes` (hand-written analysis kept in a file beside the results)."""
    cfg = results["config"]
    checks = results.get("checks") or check_targets(results)
    lines = [f"# Thinker eval: `{results['model']}`", ""]
    lines += [
        f"Held-out items: data `{cfg['data']['version']}`, seed {cfg['data']['seed']}, "
        f"{cfg['data']['items_per_family']} per family. Greedy; CoT cap {cfg['cot_cap']}, answer cap "
        f"{cfg['answer_cap']}; the model's end-of-thinking marker and EOS are honoured.",
        "",
    ]
    if training:
        lines += ["## Training", ""]
        for key, value in training.items():
            lines.append(f"- {key}: {value}")
        lines.append("")
    lines += [
        "## Natural runs",
        "",
        "| family | items | accuracy | mean score | self-stopped | loops (cap / periodic) | CoT tokens (ref) | answer tokens | distinct-4 (ref) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = list(results["families"].items()) + [("**all**", results["overall"])]
    for family, s in rows:
        lines.append(
            f"| {family} | {s['items']} | {_pct(s['accuracy'])} | {s['mean_score']:.3f} | {_pct(s['self_stopped'])} | "
            f"{s['loops']} ({s['cap_hits']} / {s['periodic_loops']}) | {s['mean_cot_tokens']:.0f} ({s['reference_mean_cot_tokens']:.0f}) | "
            f"{s['mean_answer_tokens']:.0f} | {s['distinct4']:.3f} ({s['reference_distinct4']:.3f}) |"
        )
    conv = results["convergence"]
    lines += [
        "",
        "Accuracy: the family's checker passes the whole answer (all-or-nothing; mean score is its partial credit). "
        "Self-stopped: thinking closed by the model's own marker and the answer ended at EOS. A loop is a run that hit "
        f"a cap, or whose tokens hold a block repeated ≥ {LOOP_MIN_REPEATS} times back to back over ≥ {LOOP_MIN_SPAN} tokens "
        f"(the same detector flags {results['overall']['reference_loops']} of the reference traces).",
        "",
        "## Convergence curve",
        "",
        f"Drafts forked from {conv['items']} self-stopped runs (up to {cfg['convergence_items_per_family']} per family) at "
        "each fraction of the CoT: prompt + CoT prefix + close tokens, greedy, at most "
        f"{cfg['draft_cap']} tokens. Common prefix: leading tokens shared with the final answer. Predictable: share of "
        "final-answer tokens that longest-match suffix lookup over the draft proposes and greedy verification accepts "
        "(each verification also commits one token of the model's own, not counted).",
        "",
        "| CoT seen | drafts (at the cap) | draft tokens | common prefix (tokens) | prefix share | predictable share | predictable, draft cut to the answer's length | drafts passing the checker |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, s in conv["overall"].items():
        if s["drafts"]:
            at_cap = s.get("drafts_at_cap")
            lines.append(
                f"| {float(key):.0%} | {s['drafts']} ({'–' if at_cap is None else at_cap}) | {s['draft_tokens']:.0f} | "
                f"{s['common_prefix_tokens']:.1f} | {_pct(s['prefix_share'])} | {_pct(s['predictable_share'])} | "
                f"{_pct(s.get('predictable_share_capped'))} | {_pct(s['draft_pass_rate'])} |"
            )
    control = results.get("template_control")
    if control:
        c = control["overall"]
        lines.append(
            f"| control: an unrelated answer of the same family as the draft | {c['pairs']} | – | – | {_pct(c['prefix_share'])} | "
            f"{_pct(c['predictable_share'])} | – | – |"
        )
    header = " | ".join(f"{float(k):.0%}" for k in conv["overall"])
    lines += [
        "",
        "Predictable share per family (last column: the unrelated-answer control):",
        "",
        f"| family | {header} | control |",
        "| --- " * (len(conv["overall"]) + 2) + "|",
    ]
    for family, by_point in conv["families"].items():
        floor = control["families"].get(family, {}).get("predictable_share") if control else None
        lines.append(
            f"| {family} | "
            + " | ".join(_pct(by_point[k]["predictable_share"]) for k in conv["overall"])
            + f" | {_pct(floor)} |"
        )
    lines += ["", "![convergence](convergence.png)", "", "## Acceptance checks (computed)", ""]
    lines += [
        f"- ≥ 70% accuracy in at least three families: {'yes' if checks['accuracy_ok'] else 'no'} "
        f"({', '.join(checks['families_at_or_above_70pct']) or 'none'})",
        f"- ends thinking by itself and stops at EOS in ≥ 95%: {'yes' if checks['self_stopped_ok'] else 'no'} "
        f"({_pct(results['overall']['self_stopped'])})",
        f"- no loops: {'yes' if checks['no_loops'] else 'no'} ({results['overall']['loops']})",
        f"- convergence curve rises with the draft point: {'yes' if checks['curve_rises'] else 'no'}; "
        f"with drafts cut to the answer's length: {'yes' if checks.get('curve_rises_capped') else 'no'}; "
        f"over the forks at 10-90% of the CoT only (without the prompt-only 0% point): "
        f"{'yes' if checks.get('curve_rises_after_forking') else 'no'}",
        f"- at 50% of the CoT ≥ 1/3 of the final answer predictable: {'yes' if checks['predictable_at_half_ok'] else 'no'} "
        f"({_pct(checks['predictable_at_half'])}; drafts cut to the answer's length: {_pct(checks.get('predictable_at_half_capped'))})",
        "",
        "## Where the thinker falls short (computed)",
        "",
    ]
    lines += shortfalls(results)
    seconds = results.get("seconds", {})
    lines += [
        "",
        f"Eval time: natural runs {seconds.get('natural_runs')} s, drafts {seconds.get('drafts')} s"
        + (f" on {results['device']}" if results.get("device") else "")
        + ".",
    ]
    if results.get("command"):
        lines += ["", "Command:", "", "```", results["command"], "```"]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


def shortfalls(results: dict[str, Any]) -> list[str]:
    """Bullet points naming every target a family misses, with sample checker details."""
    out = []
    for family, s in results["families"].items():
        problems = []
        if (s["accuracy"] or 0) < ACCURACY_TARGET:
            problems.append(f"accuracy {_pct(s['accuracy'])} (partial credit {s['mean_score']:.2f})")
        if (s["self_stopped"] or 0) < SELF_STOP_TARGET:
            problems.append(f"self-stopped only {_pct(s['self_stopped'])}")
        if s["loops"]:
            problems.append(f"{s['loops']} loops")
        if problems:
            failures = [r["detail"] for r in results["records"] if r["family"] == family and not r["passed"]][:2]
            sample = "; ".join(f"`{d[:120]}`" for d in failures)
            out.append(f"- **{family}**: {', '.join(problems)}." + (f" Sample failures: {sample}" if sample else ""))
    conv = results["convergence"]
    for family, by_point in conv["families"].items():
        half = by_point.get("0.50", {}).get("predictable_share")
        if half is not None and half < PREDICTABLE_AT_HALF_TARGET:
            out.append(
                f"- **{family}**: only {_pct(half)} of the final answer predictable from a draft at 50% of the CoT."
            )
    return out or ["- No target missed in this run."]


def plot_convergence(results: dict[str, Any], path: str | Path) -> Path:
    """Two panels (predictable share, common-prefix share) against the fork point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conv = results["convergence"]
    keys = list(conv["overall"])
    xs = [100 * float(k) for k in keys]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, metric, title in (
        (axes[0], "predictable_share", "final-answer tokens predictable from the draft"),
        (axes[1], "prefix_share", "common prefix of draft and final answer"),
    ):
        for family, by_point in conv["families"].items():
            ys = [by_point[k][metric] for k in keys]
            axis.plot(xs, [100 * (y or 0) for y in ys], marker="o", linewidth=1.2, alpha=0.8, label=family)
        ys = [conv["overall"][k][metric] for k in keys]
        axis.plot(xs, [100 * (y or 0) for y in ys], marker="s", color="black", linewidth=2.4, label="all")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("draft forked at % of the CoT")
        axis.set_xticks(xs)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("% of final-answer tokens")
    axes[0].set_ylim(0, 100)
    axes[0].axhline(100 / 3, color="grey", linestyle=":", linewidth=1)
    control = (results.get("template_control") or {}).get("overall", {})
    for axis, metric in ((axes[0], "predictable_share"), (axes[1], "prefix_share")):
        if control.get(metric) is not None:
            axis.axhline(
                100 * control[metric], color="black", linestyle="--", linewidth=1, label="control: unrelated answer"
            )
    axes[1].legend(fontsize=8, loc="lower right")
    # model_label: a model given as a path (an adapter written on a device) by its last component
    fig.suptitle(f"Convergence of drafts with the final answer: {model_label(results)}", fontsize=11)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def write_outputs(
    results: dict[str, Any], out_dir: str | Path, training: Mapping[str, Any] | None = None, notes: str | None = None
) -> list[Path]:
    """results.json, report.md and convergence.png under `out_dir`."""
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    results["checks"] = check_targets(results)
    paths = [target / "results.json", target / "report.md"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(render_markdown(results, training, notes))
    if results["convergence"]["items"]:
        paths.append(plot_convergence(results, target / "convergence.png"))
    return paths


__all__ = [
    "ACCURACY_TARGET",
    "PREDICTABLE_AT_HALF_TARGET",
    "SELF_STOP_TARGET",
    "check_targets",
    "plot_convergence",
    "render_markdown",
    "shortfalls",
    "write_outputs",
]
