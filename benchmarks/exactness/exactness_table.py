"""Which bench runs reproduce which outputs: a table of output hashes per (sample, mode) across files.

Why: a lossless mode's exact-match rate says whether it left *its own run's* baseline; it does not
say whether two runs (two code versions, two engine sizes, two processes) computed the same tokens.
This lines the runs up, so a regression in exactness can be traced to what differs between them:

    python benchmarks/exactness/exactness_table.py run_a.jsonl run_b.jsonl ... \
        --reference benchmarks/ssr_paper_rows/records/h200/smollm2_humaneval.jsonl.gz

Per sample and mode: one short hash per file (`=` where it equals the first file's), then per file
the share of non-baseline records equal to their own baseline. Plain and gzipped JSONL are read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from selfspec_bench.records import load_records  # noqa: E402


def read_records(path: Path) -> list[dict]:
    """The file's bench records, read as the report reads them (plain or gzipped JSONL)."""
    return load_records([path])


def hashes(records: list[dict]) -> dict[tuple[str, str], str]:
    """(sample, mode) → output hash; later records win (a resumed file's reruns)."""
    return {(r["sample_id"], r["mode"]): r["output_hash"] for r in records if r.get("output_hash")}


def _order(key: tuple[str, str]) -> tuple:
    """HumanEval/2 before HumanEval/10: numeric ids in number order, then by mode."""
    prefix, _, last = key[0].rpartition("/")
    return (prefix, int(last) if last.isdigit() else -1, key[0], key[1])


def table(runs: dict[str, dict[tuple[str, str], str]], only: set[tuple[str, str]] | None = None) -> list[str]:
    names = list(runs)
    keys = sorted({k for run in runs.values() for k in run if only is None or k in only}, key=_order)
    lines = ["| sample | mode | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for sample, mode in keys:
        first = runs[names[0]].get((sample, mode))
        cells = []
        for name in names:
            value = runs[name].get((sample, mode))
            cells.append("–" if value is None else ("=" if value == first and name != names[0] else value[:8]))
        lines.append(f"| {sample} | {mode} | " + " | ".join(cells) + " |")
    lines += ["", "| run | records | equal to own baseline |", "|---|---|---|"]
    for name, run in runs.items():
        others = [(k, v) for k, v in run.items() if k[1] != "baseline" and (k[0], "baseline") in run]
        same = sum(v == run[(k[0], "baseline")] for k, v in others)
        lines.append(f"| {name} | {len(run)} | {same} / {len(others)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument(
        "--reference",
        type=Path,
        action="append",
        default=[],
        help="Earlier runs to compare against, restricted to the samples of the runs above.",
    )
    args = parser.parse_args()
    runs = {path.name: hashes(read_records(path)) for path in args.runs}
    keys = {k for run in runs.values() for k in run}
    for path in args.reference:
        runs[f"ref:{path.name}"] = {k: v for k, v in hashes(read_records(path)).items() if k in keys}
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
