"""`selfspec_bench.jsonl`: one reader for data and records (plain or gzip), one appender that keeps lines whole."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from selfspec_bench.jsonl import JsonlError, append_jsonl, iter_jsonl, read_jsonl


def test_records_append_after_a_torn_last_line(tmp_path: Path):
    """A run killed while writing leaves a torn last line; the next run's records start on a
    line of their own (the torn one is dropped, not glued to a new record)."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"sample_id": "a"}\n{"sample_id": "b", "mo')
    append_jsonl(path, [{"sample_id": "c"}, {"sample_id": "d"}])
    assert path.read_text().splitlines() == ['{"sample_id": "a"}', '{"sample_id": "c"}', '{"sample_id": "d"}']
    append_jsonl(path, [{"sample_id": "e"}])
    assert path.read_text().endswith('{"sample_id": "d"}\n{"sample_id": "e"}\n')


def test_one_reader_for_plain_and_gzipped_files_and_three_meanings_of_a_bad_line(tmp_path: Path):
    """Data files must be whole (the error names the file and line); a records file may end in a
    line still being written; a resumed run skips what it cannot read."""
    rows = [{"task_id": "a", "é": 1}, {"task_id": "b"}]
    plain = tmp_path / "d.jsonl"
    plain.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n\n", encoding="utf-8")
    packed = tmp_path / "d.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as handle:
        handle.write(plain.read_text(encoding="utf-8"))
    assert read_jsonl(plain) == read_jsonl(packed) == rows
    assert [n for n, _ in iter_jsonl(plain)] == [1, 2]

    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"a": 1}\n{"a": 2, "b\n')
    with pytest.raises(JsonlError, match="cut.jsonl:2: not JSON"):
        read_jsonl(cut)
    assert read_jsonl(cut, bad_lines="skip-last") == [{"a": 1}]
    middle = tmp_path / "middle.jsonl"
    middle.write_text('{"a": 1}\n{"a": 2, "b\n{"a": 3}\n')
    with pytest.raises(JsonlError, match="middle.jsonl:2"):
        read_jsonl(middle, bad_lines="skip-last")
    assert read_jsonl(middle, bad_lines="skip") == [{"a": 1}, {"a": 3}]
