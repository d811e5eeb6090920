"""LongProc Pseudocode-to-Code (SPoC): compile the C++ answer and run the test cases.

As in LongProc's SPoC evaluator, the program is the fixed include header from the
prompt plus the model's code, compiled with ``g++ -std=c++11 -O``, and run on the
item's first :data:`MAX_TESTCASES` test cases (stdin = input lines, expected stdout =
output lines). Output comparison ignores trailing whitespace on each line and
trailing blank lines (LongProc compares bytes exactly). score = fraction of test
cases passed; passed = all. Without ``g++`` the item is reported as skipped.
"""

from __future__ import annotations

import shutil

from ...datasets.sample import BenchSample
from ..extract import pick_code
from ..result import ScoreResult, skipped
from ..sandbox import run_process, scratch_dir

MAX_TESTCASES = 10  # LongProc checks the first 10 test cases of each problem
CPP_FENCES = ("cpp", "c++", "cxx", "cc", "c", "")

INCLUDE_HEADER = """#include <cstdio>
#include <iostream>
#include <vector>
#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstring>
#include <set>
#include <map>
#include <queue>
#include <stack>
#include <list>
#include <fstream>
#include <climits>
#include <cassert>
#include <iomanip>
#include <sstream>
#include <bitset>
using namespace std;
"""


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def compiler() -> str | None:
    return shutil.which("g++")


def score_pseudo_to_code(
    sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0, max_testcases: int | None = MAX_TESTCASES
) -> ScoreResult:
    gxx = compiler()
    if gxx is None:
        return skipped("g++ not found; pseudo_to_code needs a C++ compiler")
    code = pick_code(completion_text, languages=CPP_FENCES, must_match=r"\bmain\s*\(")
    testcases = sample.reference["testcases"][:max_testcases]
    with scratch_dir() as workdir:
        (workdir / "main.cpp").write_text(INCLUDE_HEADER + code, encoding="utf-8")
        build = run_process(
            [gxx, "-std=c++11", "-O", "-o", "main", "main.cpp"],
            cwd=workdir,
            timeout_s=max(3 * timeout_s, 30.0),
            limit_memory=False,
        )
        if not build.ok:
            return ScoreResult(False, 0.0, f"compilation failed: {build.describe()}")
        failures: list[str] = []
        for index, (inputs, outputs) in enumerate(testcases):
            run = run_process(
                [str(workdir / "main")], cwd=workdir, timeout_s=timeout_s, stdin_text="\n".join(inputs) + "\n"
            )
            if not run.ok:
                failures.append(f"#{index}: {run.describe()}")
            elif _lines(run.stdout) != _lines("\n".join(outputs)):
                failures.append(f"#{index}: wrong output")
    passed = len(testcases) - len(failures)
    detail = f"{passed}/{len(testcases)} test cases passed" + (f" ({'; '.join(failures[:3])})" if failures else "")
    return ScoreResult(
        passed=bool(testcases) and not failures, score=passed / len(testcases) if testcases else 0.0, detail=detail
    )
