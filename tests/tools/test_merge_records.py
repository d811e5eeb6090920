"""tools/merge_records.py keeps what the report keeps: the last record of a (model, benchmark, sample,
mode, settings) key wins, in the report's order, so a report of the merged file is the inputs' report."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from selfspec_bench.records import _record_key, load_records


def _rec(sample: str, mode: str, latency: float, **settings) -> dict:
    return {
        "model": "m",
        "benchmark": "b",
        "sample_id": sample,
        "mode": mode,
        "latency_s": latency,
        "dtype": "bfloat16",
        "settings": {"cot_cap": 10, **settings},
    }


def _write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def test_the_last_record_of_a_key_wins_and_the_order_is_the_reports(tmp_path, repo_script):
    module = repo_script("tools/merge_records.py")
    old = _write(
        tmp_path / "old.jsonl",
        [
            _rec("s1", "baseline", 1.0),
            _rec("s1", "sps", 2.0),
            _rec("s2", "baseline", 3.0),
            _rec("s1", "baseline", 9.0, cot_cap=20),
        ],
    )  # other settings: its own key
    rerun = _write(tmp_path / "rerun.jsonl", [_rec("s1", "sps", 0.5)], tail='{"sample_id": "s3", "mo')  # torn last line
    out = tmp_path / "merged.jsonl.gz"
    module.main([str(old), str(rerun), "--out", str(out)])
    merged = [json.loads(line) for line in gzip.open(out, "rt")]
    assert [(r["sample_id"], r["mode"], r["latency_s"]) for r in merged] == [
        ("s1", "baseline", 1.0),
        ("s2", "baseline", 3.0),
        ("s1", "baseline", 9.0),
        ("s1", "sps", 0.5),
    ]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("loop", "loop_kind")} for r in rs]  # noqa: E731
    assert strip(load_records([out])) == strip(load_records([old, rerun]))
    assert gzip.open(out).read() and out.read_bytes()[4:8] == b"\0\0\0\0"  # no timestamp: reproducible bytes


def test_the_key_is_the_reports_key(repo_script):
    module = repo_script("tools/merge_records.py")
    for rec in (_rec("s1", "baseline", 1.0), {**_rec("s1", "sps", 1.0, run_name="x"), "model": "/tmp/out/q/adapter"}):
        assert module.record_key(rec) == _record_key(rec)
