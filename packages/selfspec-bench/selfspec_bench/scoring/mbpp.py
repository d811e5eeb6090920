"""MBPP: run the model's function against the item's test asserts.

The candidate module is the extracted code followed by ``test_setup_code`` (which can
use the solution's classes); each assert then runs on its own in that namespace, so
the score is the fraction of asserts passed and passed = all of them.
"""

from __future__ import annotations

import re

from ..datasets.sample import BenchSample
from .extract import pick_code
from .harness import LAUNCHER_FILE, assert_launcher, new_result_file, read_report, write_candidate
from .humaneval import PYTHON_FENCES
from .result import ScoreResult
from .sandbox import run_python_file, scratch_dir


def score_mbpp(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    ref = sample.reference
    tests: list[str] = list(ref["tests"])
    entry_point = ref.get("entry_point")
    must_match = rf"def\s+{re.escape(entry_point)}\s*\(" if entry_point else None
    code = pick_code(completion_text, languages=PYTHON_FENCES, must_match=must_match)
    candidate = f"{code}\n\n{ref.get('test_setup_code', '')}\n"
    result_file = new_result_file()
    with scratch_dir() as workdir:
        write_candidate(workdir, candidate, assert_launcher(tests, unit_timeout_s=timeout_s, result_file=result_file))
        outcome = run_python_file(LAUNCHER_FILE, workdir=workdir, timeout_s=timeout_s * (len(tests) + 1))
        report = read_report(workdir, result_file)
    if not isinstance(report, list) or len(report) != len(tests):
        return ScoreResult(False, 0.0, f"no test report ({outcome.describe()})")
    passed = sum(1 for status in report if status == "pass")
    failures = [f"#{i}: {status}" for i, status in enumerate(report) if status != "pass"]
    detail = f"{passed}/{len(tests)} asserts passed" + (f" ({', '.join(failures)})" if failures else "")
    return ScoreResult(passed == len(tests), passed / len(tests) if tests else 0.0, detail)
