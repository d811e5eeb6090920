"""Every GPU queue's calls of the project's scripts name scripts that exist and flags they accept.

Why: a queue runs on a lent GPU machine whose minutes are scarce; a misspelt or removed flag
fails its line there (argparse exits 2) and costs the line's share of the block, found only when
its records come back. Each script's `--help` is read once here on the CPU (the scripts import
their GPU-only dependencies inside `main`, so `--help` runs anywhere).
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUEUES = sorted((ROOT / "tools" / "gpu" / "queues").glob("*.txt"))
CALL = re.compile(r"python3? ((?:benchmarks|tools)/\S+\.py)(.*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def script_calls(queue: Path) -> list[tuple[int, str, list[str]]]:
    """(line number, script, flags) for each call of one of the project's scripts in a queue:
    commands split at shell separators, comment lines skipped."""
    calls = []
    for number, line in enumerate(queue.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for command in re.split(r";|&&|\|", line):
            match = CALL.search(command)
            if match:
                calls.append((number, match.group(1), FLAG.findall(match.group(2))))
    return calls


@cache
def accepted_flags(script: str) -> frozenset[str]:
    result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{script} --help failed:\n{result.stderr[-2000:]}"
    return frozenset(FLAG.findall(result.stdout))


def test_every_queue_line_that_runs_a_script_of_ours_is_read():
    """No call slips past the parser: each line naming one of our scripts yields a call."""
    found = set()
    for queue in QUEUES:
        calls = script_calls(queue)
        found |= {script for _, script, _ in calls}
        lines = {number for number, _, _ in calls}
        for number, line in enumerate(queue.read_text().splitlines(), 1):
            if not line.lstrip().startswith("#") and re.search(r"(benchmarks|tools)/\S+\.py", line):
                assert number in lines, f"{queue.name}:{number} not read: {line[:120]}"
    assert {"benchmarks/engine_speed.py", "benchmarks/vllm_speed.py", "tools/gpu/gpu_check.py"} <= found


@pytest.mark.parametrize("queue", QUEUES, ids=[q.stem for q in QUEUES])
def test_queue_flags_are_accepted_by_their_scripts(queue: Path):
    wrong = []
    for number, script, flags in script_calls(queue):
        if not (ROOT / script).is_file():
            wrong.append(f"line {number}: {script} does not exist")
            continue
        wrong += [f"line {number}: {script} has no {flag}" for flag in flags if flag not in accepted_flags(script)]
    assert not wrong, "\n".join(wrong)


def test_a_flag_a_script_lacks_is_found(tmp_path: Path):
    queue = tmp_path / "q.txt"
    queue.write_text(
        "# a comment --not-a-flag\nmkdir -p $Q_OUT; timeout 60 python3 benchmarks/vllm_tp.py --shape x --nope 1\n"
    )
    ((number, script, flags),) = script_calls(queue)
    assert (number, script, flags) == (2, "benchmarks/vllm_tp.py", ["--shape", "--nope"])
    assert "--shape" in accepted_flags(script) and "--nope" not in accepted_flags(script)
