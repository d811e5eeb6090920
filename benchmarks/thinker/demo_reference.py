"""The H200 figures `selfspec demo` prints beside its own: SSR on the demo's model and task family.

The demo runs one prompt on the machine in front of the user; this summarises the committed
H200 records of the same thinker on held-out items of the same family (baseline vs SSR
prefix+suffix, paired per item), so the user sees both. It writes the summary into the package
(`selfspec/cli/demo_reference.json`) because an installed selfspec has no benchmark records;
a test recomputes it from the records, so the shipped figures cannot drift from them.

    python benchmarks/thinker/demo_reference.py
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDS = Path("benchmarks/thinker/records/h200/smollm2-thinker-v4b_thinker-class_synthesis.jsonl.gz")
OUT = ROOT / "selfspec" / "cli" / "demo_reference.json"
BASELINE, SSR = "baseline", "prefix+suffix"


def summarise(records: Path = RECORDS) -> dict:
    """Paired means over the items that ran both modes."""
    rows = [json.loads(line) for line in gzip.open(ROOT / records, "rt")]
    by_item: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_item.setdefault(row["sample_id"], {})[row["mode"]] = row
    pairs = [(m[BASELINE], m[SSR]) for m in by_item.values() if BASELINE in m and SSR in m]
    if not pairs:
        raise ValueError(f"{records}: no item has both {BASELINE!r} and {SSR!r} records")
    base, ssr = pairs[0]
    return {
        "model": ssr["model"],
        "benchmark": ssr["benchmark"],
        "items": len(pairs),
        "device": ssr["device"],
        "dtype": ssr["dtype"],
        "date": ssr["date"],
        "baseline_latency_s": round(statistics.mean(b["latency_s"] for b, _ in pairs), 4),
        "ssr_latency_s": round(statistics.mean(s["latency_s"] for _, s in pairs), 4),
        "speedup": round(statistics.mean(b["latency_s"] / s["latency_s"] for b, s in pairs), 4),
        "first_answer_token_ratio": round(
            statistics.mean(s["first_answer_token_s"] / b["first_answer_token_s"] for b, s in pairs), 4
        ),
        "exact_match": all(s["exact_match"] for _, s in pairs),
        "command": re.sub(r" --out \S+", "", ssr["command"]),  # the machine's scratch path left out
        "records": str(records),
    }


def main() -> None:
    OUT.write_text(json.dumps(summarise(), indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
