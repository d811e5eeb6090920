"""Merge bench record files into one, keeping what `selfspec bench report` would keep.

    python tools/merge_records.py benchmarks/ssr_paper_rows/records/h200/smollm2_longproc-tom_tracking.jsonl.gz \
        tom_tracking_alone.jsonl --out benchmarks/ssr_paper_rows/records/h200/smollm2_longproc-tom_tracking.jsonl.gz

Why: each experiment keeps one records file (benchmarks/<topic>/records/<device>/<name>.jsonl.gz), but a rerun of
some samples (alone on the GPU, after an engine fix) is written to a file of its own. The report reads several
files with "the last record of a key wins" (key: model, benchmark, sample, mode, settings); this applies the same
rule and writes the surviving lines unchanged, in the order the report would hold them, so a report of the merged
file is the report of the inputs. A bad last line of an input (a run still writing) is skipped, as the report
skips it; a bad line anywhere else is an error. `.gz` outputs are written reproducibly (no timestamp).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path

from selfspec_bench.records import model_label, run_settings, settings_key


def record_key(rec: dict) -> tuple:
    """The report's deduplication key (`selfspec_bench.records.load_records`): model, benchmark, sample, mode, settings."""
    return (model_label(rec), rec.get("benchmark"), rec["sample_id"], rec["mode"], settings_key(run_settings(rec)))


def read_text(path: Path) -> str:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as handle:
            return handle.read()
    return path.read_text()


def merge(inputs: list[Path]) -> list[str]:
    """The surviving record lines of `inputs`, last record of a key winning, in the report's order."""
    latest: dict[tuple, str] = {}
    for path in inputs:
        lines = read_text(path).splitlines()
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if lineno == len(lines):
                    print(f"merge_records: skipped a partial last line of {path}", file=sys.stderr)
                    continue
                raise SystemExit(f"{path}:{lineno}: not JSON ({exc})")
            if not isinstance(rec, dict) or "mode" not in rec or "sample_id" not in rec:
                raise SystemExit(f"{path}:{lineno}: not a bench record (needs 'sample_id' and 'mode')")
            key = record_key(rec)
            latest.pop(key, None)  # re-insert so the order follows the latest write, as the report does
            latest[key] = line
    return list(latest.values())


def write(lines: list[str], out: Path) -> None:
    data = "".join(line + "\n" for line in lines).encode()
    if out.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as handle:
            handle.write(data)
        data = buf.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="record files, oldest first (plain or .gz)")
    parser.add_argument(
        "--out", type=Path, required=True, help="the merged file (.jsonl or .jsonl.gz); may be an input"
    )
    args = parser.parse_args(argv)
    lines = merge(args.inputs)
    write(lines, args.out)
    print(f"{len(lines)} records -> {args.out}")


if __name__ == "__main__":
    main()
