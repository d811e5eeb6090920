"""`benchmarks/server_load.py`: the sweep runs end to end on the tiny model (two servers, off and auto),
writes the documented JSON and table, and exits 0; a lost, truncated or different response fails a level."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "server_load.py"
sys.path.insert(0, str(SCRIPT.parent))

from server_load.clients import StreamResult  # noqa: E402
from server_load.output import COLUMNS  # noqa: E402
from server_load.stats import level_passed, summarize_level  # noqa: E402

LEVEL_KEYS = {
    "mode", "concurrency", "requests", "completed", "errors", "lost", "truncated", "different_from_reference",
    "duration_s", "request_throughput", "output_throughput", "completion_tokens",
    "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p50_itl_ms", "p99_itl_ms",
    "mean_tpot_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_e2el_ms", "p99_e2el_ms", "slots_in_use_after", "passed",
}  # fmt: skip


def test_sweep_on_the_tiny_model_writes_json_table_and_plot(tmp_path):
    out = tmp_path / "load"
    command = [sys.executable, str(SCRIPT), "--model", "tiny", "--modes", "off,auto", "--concurrency", "1,4"]
    command += ["--min-requests", "4", "--max-tokens", "12", "--disconnects", "2", "--out-dir", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("[off c=") == 2 and run.stdout.count("[auto c=") == 2  # a progress line per level

    result = json.loads((out / "results.json").read_text())
    assert {"command", "date", "device", "versions", "settings", "levels", "disconnects", "passed"} <= set(result)
    assert result["passed"] is True and "torch" in result["versions"]
    assert [(level["mode"], level["concurrency"]) for level in result["levels"]] == [
        ("off", 1), ("off", 4), ("auto", 1), ("auto", 4)
    ]  # fmt: skip
    for level in result["levels"]:
        assert LEVEL_KEYS <= set(level)
        assert level["completed"] == level["requests"] == max(2 * level["concurrency"], 4)
        assert level["errors"] == level["lost"] == level["truncated"] == level["different_from_reference"] == 0
        assert level["output_throughput"] > 0 and 0 < level["p50_ttft_ms"] <= level["p99_ttft_ms"]
        assert level["completion_tokens"] == 12 * level["requests"]  # the tiny model never stops early
    assert all(check["slots_in_use_after"] == 0 for check in result["disconnects"].values())

    table = (out / "README.md").read_text()
    header = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    assert header in table and "| auto | 4 |" in table and "| off | 1 |" in table
    assert (out / "throughput_ttft.png").stat().st_size > 1000


def _result(index: int, text: str, tokens: int, *, done: bool = True, reason: str | None = "length") -> StreamResult:
    r = StreamResult(prompt_index=index, text=text, completion_tokens=tokens, saw_done=done, finish_reason=reason)
    r.started, r.first_token, r.ended, r.chunks = 0.0, 0.1, 0.5, tokens
    r.chunk_times = [0.1 + 0.4 * i / max(tokens - 1, 1) for i in range(tokens)]
    r.ok = done and reason is not None
    return r


@pytest.mark.parametrize(
    ("bad", "count"),
    [
        (_result(1, "b-other", 5), "different_from_reference"),
        (_result(1, "b", 3), "truncated"),  # finish_reason length before max_tokens
        (_result(1, "b", 5, done=False, reason=None), "lost"),
    ],
)
def test_a_bad_response_fails_its_level(bad, count):
    refs = [("a", 5), ("b", 5)]
    good = summarize_level([_result(0, "a", 5), _result(1, "b", 5)], refs, wall_s=1.0, requests=2, max_tokens=5)
    assert level_passed(good) and good["output_throughput"] == 10.0 and good["p50_itl_ms"] == 100.0
    summary = summarize_level([_result(0, "a", 5), bad], refs, wall_s=1.0, requests=2, max_tokens=5)
    assert summary[count] == 1 and not level_passed(summary)


def test_a_request_that_never_returned_counts_as_lost():
    summary = summarize_level([_result(0, "a", 5)], [("a", 5)], wall_s=1.0, requests=2, max_tokens=5)
    assert summary["lost"] == 1 and not level_passed(summary)


def test_a_remote_url_is_refused():
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--url", "http://example.com:8000", "--modes", "off"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert run.returncode != 0 and "loopback" in run.stderr
