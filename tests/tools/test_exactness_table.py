"""benchmarks/exactness/exactness_table.py lines runs up by (sample, mode) and counts agreement with each run's baseline."""

from __future__ import annotations

import json


def test_table_marks_equal_hashes_and_counts_own_baseline_matches(tmp_path, repo_script):
    module = repo_script("benchmarks/exactness/exactness_table.py")

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"sample_id": s, "mode": m, "output_hash": h}) + "\n" for s, m, h in rows))
        return path

    a = write("a.jsonl", [("H/10", "baseline", "aaaa1111"), ("H/10", "sps", "aaaa1111"), ("H/2", "baseline", "bbbb")])
    b = write("b.jsonl", [("H/10", "baseline", "aaaa1111"), ("H/10", "sps", "cccc2222"), ("H/2", "baseline", "bbbb")])
    runs = {p.name: module.hashes(module.read_records(p)) for p in (a, b)}
    lines = module.table(runs)
    assert lines[2].startswith("| H/2 | baseline | bbbb | = |")  # numeric order: 2 before 10
    assert "| H/10 | sps | aaaa1111 | cccc2222 |" in lines
    assert "| a.jsonl | 3 | 1 / 1 |" in lines and "| b.jsonl | 3 | 0 / 1 |" in lines
