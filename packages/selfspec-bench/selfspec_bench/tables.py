"""The report's markdown tables: one row per mode of a run, and the tables of its run checks.

Why apart from `report.py`: what a figure looks like in a cell ("1.667x", "25.0%", "n/a" for a
figure a run cannot give) must be the same in every table of a report, and every table is drawn
by one call to `tabulate`, so this module owns both; `report.py` decides which tables a report
holds and in what order, `run_checks.py` computes what the check tables show.
"""

from __future__ import annotations

from typing import Any, Sequence

from tabulate import tabulate

from selfspec_bench.records import BASELINE, Group, mode_order
from selfspec_bench.run_checks import SHARING_CONDITIONS, position_check

MODE_TABLE_HEADERS = (
    "mode",
    "n",
    "latency (s)",
    "speedup (paired)",
    "latency reduction",
    "accepted prefix",
    "suffix-accepted",
    "first answer token (s)",
    "oracle speedup",
    "oracle realized",
    "exact match",
    "pass rate",
    "loops",
    "no answer",
    "forced past end-of-text",
)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-markdown table of cells as given: the cells are formatted already (`fmt`), so
    tabulate neither re-parses numbers nor pads columns (rows stay greppable: `| prefix | 3 |`)."""
    return tabulate(rows, headers=list(headers), tablefmt="github", disable_numparse=True, stralign=None, numalign=None)


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    """`value` in format `spec` plus `suffix` ("1.667x", "25%" with spec ".0%"); "n/a" for None."""
    if value is None:
        return "n/a"
    return f"{value:{spec}}{suffix}"


def mode_table(table: dict[str, dict[str, Any]]) -> str:
    """One row per mode of `Group.table()`."""
    return markdown(MODE_TABLE_HEADERS, [_mode_row(mode, s) for mode, s in table.items()])


def _mode_row(mode: str, s: dict[str, Any]) -> list[Any]:
    pass_rate = f"{fmt(s['pass_rate'], '.0%')} ({s['n_scored']})" if s["n_scored"] else "n/a"
    if s.get("n_scored_at_eos") and s.get("mean_forced_past_eos"):  # some answers were forced past their end
        pass_rate += f"; cut at its end-of-text {fmt(s['pass_rate_at_eos'], '.0%')} ({s['n_scored_at_eos']})"
    no_answer = s.get("no_answer", 0)
    first_answer = fmt(s["mean_first_answer_token_s"])
    if no_answer and s["mean_first_answer_token_s"] is not None:
        first_answer += f" ({s['n'] - no_answer} answered)"  # a mean over the runs that answered
    return [
        mode,
        s["n"],
        fmt(s["mean_latency_s"]),
        fmt(s["speedup"], ".3f", "x"),
        fmt(s["latency_reduction_pct"], ".1f", "%"),
        fmt(s["mean_accepted_prefix"], ".1f"),
        fmt(s["mean_suffix_accepted_tokens"], ".1f"),
        first_answer,
        fmt(s["mean_oracle_speedup"], ".3f", "x"),
        fmt(s["oracle_fraction"], ".0%"),
        fmt(s["exact_match_rate"], ".0%"),
        pass_rate,
        s["loops"],
        no_answer,
        fmt(s.get("mean_forced_past_eos"), ".0f"),
    ]


def settings_line(settings: dict[str, Any]) -> str:
    """A run's settings on one line: `cot_cap=400; suffix(max_depth=4); suffix_sources=draft+prompt`."""
    parts = []
    for key, value in settings.items():
        if isinstance(value, dict):
            parts.append(f"{key}({', '.join(f'{k}={v}' for k, v in value.items())})")
        elif isinstance(value, list):
            parts.append(f"{key}={'+'.join(map(str, value))}")
        else:
            parts.append(f"{key}={value}")
    return "; ".join(parts) if parts else "n/a"


def meta_lines(meta: dict[str, list[Any]]) -> list[str]:
    """`Group.meta()` as a markdown list: device, dtype, date, versions, the commands that made the run."""
    lines = [f"- {key}: {', '.join(map(str, meta[key])) or 'n/a'}" for key in ("device", "dtype", "date")]
    versions = [
        "; ".join(f"{k} {v}" for k, v in v.items()) if isinstance(v, dict) else str(v) for v in meta["versions"]
    ]
    lines.append(f"- versions: {' | '.join(versions) or 'n/a'}")
    lines += [f"- command: `{cmd}`" for cmd in meta["command"]] or ["- command: n/a"]
    return lines


def timing_lines(check: dict[str, Any]) -> list[str]:
    """The batches `run_checks.timing_check` flagged, or nothing."""
    if not check["flagged"]:
        return []
    lines = [
        "**Timing check: some batches ran slower per forward than the rest of their mode** — their "
        "samples' paired speedups are suspect (e.g. a first timed run that paid for compilations):",
        "",
    ]
    for f in check["flagged"]:
        first, last = f["batch"] * check["concurrency"], (f["batch"] + 1) * check["concurrency"] - 1
        lines.append(
            f"- {f['mode']}, batch {f['batch']} (samples {first}–{last} in run order): "
            f"{f['ms_per_forward']:.2f} ms per forward vs median {f['median_ms']:.2f}"
        )
    return lines + [""]


def position_tables(group: Group, everything: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """One place table, or two where a run's records differ in the per-sample warm-up (short
    untimed runs meant to remove the first place's cost): the pair shows whether it did."""
    flags = {bool(r.get("group_warm_up")) for r in group.records if r.get("run_position")}
    if len(flags) < 2:
        return _position_lines(everything)
    return _position_lines(
        position_check(group, warmed=False), " — samples without the per-sample warm-up"
    ) + _position_lines(position_check(group, warmed=True), " — samples with the per-sample warm-up")


def _position_lines(check: dict[str, dict[int, dict[str, float]]], label: str = "") -> list[str]:
    positions = sorted({p for per in check.values() for p in per})
    if len(positions) < 2:
        return []
    rows = [
        [
            mode,
            *(
                f"{check[mode][p]['median_ms_per_forward']:.3f} ({check[mode][p]['n']})" if p in check[mode] else "–"
                for p in positions
            ),
        ]
        for mode in mode_order(check)
    ]
    return [
        f"### Time per forward by place in the run order{label}",
        "",
        "Median ms per forward (n) of each mode at each place in its sample's order; the order rotates from "
        "sample to sample, so a place that costs more shows as a column that is higher for every mode.",
        "",
        markdown(["mode", *(f"place {p}" for p in positions)], rows),
        "",
    ]


def sharing_lines(check: dict[str, Any]) -> list[str]:
    """`run_checks.sharing_check` as a table, or nothing when no sample shared its GPU."""
    if not check:
        return []
    conditions = [c for c in SHARING_CONDITIONS if c in check["samples"]]
    shared, total = check["samples"]["shared"], sum(check["samples"].values())
    effect = (
        "their forwards take longer, so the mean latencies above mix conditions"
        if shared < total
        else "forwards take longer than on a GPU of its own, so the mean latencies above are not those of a lone run"
    )
    rows = []
    for mode in mode_order(check["modes"]):
        cells = [check["modes"][mode].get(c) for c in conditions]
        rows.append(
            [
                mode,
                *(
                    "–"
                    if not cell
                    else f"{fmt(cell['median_ms_per_forward'], '.3f')} / "
                    f"{fmt(cell['mean_speedup'], '.3f', 'x')} ({cell['n']})"
                    for cell in cells
                ),
            ]
        )
    return [
        "### Runs that shared the GPU with other processes",
        "",
        f"{shared} of {total} samples ran while other processes used the same GPU (`gpu_co_tenants`): {effect}. "
        "Every mode of a sample ran under the same condition, so paired speedups compare like with like; "
        "this table shows whether sharing moved them. Cells: median ms per forward / mean paired speedup (n).",
        "",
        markdown(["mode", *(f"{c} ({check['samples'][c]} samples)" for c in conditions)], rows),
        "",
    ]


def divergence_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """`run_checks.divergence_summary` as a table, or nothing when every lossless mode stayed exact."""
    if not summary:
        return []
    rows = [
        [
            mode,
            f"{row['left_baseline']} / {row['compared']}",
            row["in_cot"],
            row["in_answer"],
            ", ".join(f"{s['mode_shape']} ← {s['baseline_shape']}: {s['count']}" for s in row["shapes"][:4]),
        ]
        for mode, row in summary.items()
    ]
    headers = [
        "mode",
        "left / compared",
        "in CoT",
        "in answer",
        "shapes at the first difference (mode ← baseline: count)",
    ]
    return [
        "### Where lossless modes left the baseline's tokens",
        "",
        "First differing token per record: its phase, and the forward shape (rows x tokens per row, as padded) that "
        "chose it in the mode and in the baseline (`forced`: appended by a policy; `?`: records without "
        "shapes).",
        "",
        markdown(headers, rows),
        "",
    ]


def exactness_by_source_lines(by_source: dict[str, dict[str, tuple[int, int]]]) -> list[str]:
    """`run_checks.exactness_by_source` as a table, or nothing when the run holds one package source."""
    if len(by_source) < 2:
        return []
    modes = mode_order({m for per_mode in by_source.values() for m in per_mode})
    rows = [
        [source, *(f"{per_mode[m][0]} / {per_mode[m][1]}" if m in per_mode else "–" for m in modes)]
        for source, per_mode in by_source.items()
    ]
    return [
        "### Exact match by package source",
        "",
        "This run's records come from more than one version of the package (a resumed file spans code changes): "
        "records equal to their baseline / records compared, per source hash.",
        "",
        markdown(["package source", *modes], rows),
        "",
    ]


def concurrency_lines(checks: list[dict[str, Any]]) -> list[str]:
    """`run_checks.concurrency_checks` as one table per pair of runs, or nothing."""
    if not checks:
        return []
    md = [
        "## Concurrency check: per-request speedups with one request at a time vs a shared batch",
        "",
        "Samples run both ways; each speedup is paired within its own run's baseline. Batched runs are "
        "trusted only where these agree within noise.",
        "",
    ]
    for check in checks:
        rows = [
            [mode, fmt(row["single"], ".3f", "x"), fmt(row["batched"], ".3f", "x"), fmt(row["difference"], "+.3f")]
            for mode, row in check["modes"].items()
        ]
        md += [
            f"{check['label']} (concurrency 1 vs {check['concurrency']}, {check['n_common']} common samples):",
            "",
            markdown(["mode", "speedup, one at a time", "speedup, batched", "difference"], rows),
            "",
        ]
    return md


def rerun_lines(checks: list[dict[str, Any]]) -> list[str]:
    """`run_checks.rerun_checks` as one table per named run, or nothing."""
    if not checks:
        return []
    lines = [
        "## The same samples in a named run and in the unnamed run of the same settings",
        "",
        "Each cell: median ms per forward / mean paired speedup (each run paired with its own baseline); "
        "*same tokens*: samples whose output hash is equal in both runs.",
        "",
    ]
    for c in checks:
        where = "; ".join(
            f"{'unnamed run' if side == 'reference' else 'run ' + c['run_name']}: "
            + ", ".join(f"{n} {cond}" for cond, n in sorted(counts.items()))
            for side, counts in c["sharing"].items()
        )
        rows = []
        for mode, row in c["modes"].items():
            cells = [
                f"{fmt(row[side]['median_ms_per_forward'], '.3f')} / "
                + ("–" if mode == BASELINE else fmt(row[side]["speedup"], ".3f", "x"))
                for side in ("reference", "named")
            ]
            a, b = row["reference"]["speedup"], row["named"]["speedup"]
            rows.append(
                [mode, *cells, "–" if None in (a, b) else f"{b - a:+.3f}", f"{row['same_tokens']} / {row['compared']}"]
            )
        lines += [
            f"{c['label']}, unnamed run vs run {c['run_name']} ({c['n_common']} common samples; GPU — {where}):",
            "",
            markdown(["mode", "unnamed run", f"run {c['run_name']}", "speedup difference", "same tokens"], rows),
            "",
        ]
    return lines


def decode_ahead_lines(check: dict[str, int | None]) -> list[str]:
    """`run_checks.decode_ahead_check` as one sentence, or nothing for records without the field."""
    if not check:
        return []
    parts = [f"{mode} {'serially' if n is None else f'{n:,} steps ahead'}" for mode, n in sorted(check.items())]
    note = (
        " A baseline run serially (under a schedule recorder) is slower than the engine's own plain decoding."
        if check.get("baseline", 0) is None
        else ""
    )
    return [f"Decoding one step ahead (`engine.decode_ahead`): {'; '.join(parts)}.{note}", ""]
