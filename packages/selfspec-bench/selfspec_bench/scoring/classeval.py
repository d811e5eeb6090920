"""ClassEval: run the generated class against the item's unittest classes.

As in ClassEval's pipeline, the candidate is the item's import statements, the
extracted class code and the test code, loaded as a module; each test class listed
in ``test_classes`` runs separately under its own timeout. score = fraction of test
methods passed over all listed classes; passed = every method passed.
"""

from __future__ import annotations

import re

from ..datasets.sample import BenchSample
from .extract import pick_code
from .harness import LAUNCHER_FILE, new_result_file, read_report, unittest_launcher, write_candidate
from .humaneval import PYTHON_FENCES
from .result import ScoreResult
from .sandbox import run_python_file, scratch_dir


def score_classeval(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    ref = sample.reference
    class_names: list[str] = list(ref["test_classes"])
    code = pick_code(completion_text, languages=PYTHON_FENCES, must_match=rf"^class\s+{re.escape(ref['class_name'])}\b")
    candidate = "\n".join(ref.get("import_statement", [])) + f"\n{code}\n\n{ref['test']}\n"
    result_file = new_result_file()
    with scratch_dir() as workdir:
        launcher = unittest_launcher(class_names, unit_timeout_s=timeout_s, result_file=result_file)
        write_candidate(workdir, candidate, launcher)
        outcome = run_python_file(LAUNCHER_FILE, workdir=workdir, timeout_s=timeout_s * (len(class_names) + 1))
        report = read_report(workdir, result_file)
    if not isinstance(report, dict):
        return ScoreResult(False, 0.0, f"no test report ({outcome.describe()})")
    total = sum(entry["run"] for entry in report.values())
    failed = sum(entry["failed"] for entry in report.values())
    classes_passed = sum(1 for entry in report.values() if entry["run"] > 0 and entry["failed"] == 0)
    failing = [name for name, entry in report.items() if entry["run"] == 0 or entry["failed"] > 0]
    detail = f"{total - failed}/{total} test methods, {classes_passed}/{len(class_names)} test classes passed" + (
        f"; failing: {', '.join(failing)}" if failing else ""
    )
    passed = total > 0 and failed == 0 and classes_passed == len(class_names)
    return ScoreResult(passed, (total - failed) / total if total else 0.0, detail)
