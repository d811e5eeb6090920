"""Launchers that run a candidate program inside the sandboxed child.

The candidate is always loaded with ``runpy.run_path`` under a non-``__main__`` name,
as the original harnesses do (HumanEval ``exec``s without ``__name__``, ClassEval
imports its test modules), so a model's ``if __name__ == "__main__":`` demo block or
a test file's ``unittest.main()`` does not run. For HumanEval the exit code is the
verdict. ClassEval and MBPP give partial credit, so their launcher then runs each
unit (a unittest class, an assert) under its own alarm and writes the counts as JSON
to a result file whose name carries a random nonce. The parent reads that file; a
missing file means the candidate died before reporting (syntax error, import error,
hard crash).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

CANDIDATE_FILE = "candidate.py"
LAUNCHER_FILE = "launcher.py"

_PRELUDE = """
import io, json, runpy, signal, sys, unittest

class _UnitTimeout(Exception):
    pass

def _alarm(signum, frame):
    raise _UnitTimeout()

signal.signal(signal.SIGALRM, _alarm)
sys.path.insert(0, ".")
namespace = runpy.run_path({candidate!r}, run_name="selfspec_candidate")
"""

_UNITTEST_BODY = """
results = {{}}
for name in {names!r}:
    case = namespace.get(name)
    if case is None:
        results[name] = {{"run": 0, "failed": 0, "missing": True}}
        continue
    suite = unittest.TestLoader().loadTestsFromTestCase(case)
    planned = suite.countTestCases()
    signal.setitimer(signal.ITIMER_REAL, {unit_timeout_s!r})
    try:
        outcome = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
        failed = len(outcome.failures) + len(outcome.errors) + len(outcome.unexpectedSuccesses)
        results[name] = {{"run": planned, "failed": min(planned, failed + planned - outcome.testsRun)}}
    except _UnitTimeout:
        results[name] = {{"run": planned, "failed": planned, "timeout": True}}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
with open({result_file!r}, "w") as handle:
    json.dump(results, handle)
"""

_ASSERT_BODY = """
results = []
for source in {tests!r}:
    signal.setitimer(signal.ITIMER_REAL, {unit_timeout_s!r})
    try:
        exec(compile(source, "<test>", "exec"), namespace)
        results.append("pass")
    except _UnitTimeout:
        results.append("timeout")
    except BaseException as error:  # SystemExit from the code under test is a failure too
        results.append(type(error).__name__)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
with open({result_file!r}, "w") as handle:
    json.dump(results, handle)
"""


def plain_launcher() -> str:
    """Launcher that only runs the candidate; an uncaught exception gives a non-zero exit code."""
    return _PRELUDE.format(candidate=CANDIDATE_FILE)


def new_result_file() -> str:
    return f"selfspec_result_{secrets.token_hex(8)}.json"


def unittest_launcher(test_class_names: list[str], *, unit_timeout_s: float, result_file: str) -> str:
    """Launcher that runs each named TestCase class of the candidate; reports ``{name: {run, failed}}``."""
    return _PRELUDE.format(candidate=CANDIDATE_FILE) + _UNITTEST_BODY.format(
        names=list(test_class_names), unit_timeout_s=float(unit_timeout_s), result_file=result_file
    )


def assert_launcher(tests: list[str], *, unit_timeout_s: float, result_file: str) -> str:
    """Launcher that execs each test statement in the candidate's namespace; reports ``["pass" | error, ...]``."""
    return _PRELUDE.format(candidate=CANDIDATE_FILE) + _ASSERT_BODY.format(
        tests=list(tests), unit_timeout_s=float(unit_timeout_s), result_file=result_file
    )


def write_candidate(workdir: Path, candidate: str, launcher: str) -> None:
    (Path(workdir) / CANDIDATE_FILE).write_text(candidate, encoding="utf-8")
    (Path(workdir) / LAUNCHER_FILE).write_text(launcher, encoding="utf-8")


def read_report(workdir: Path, result_file: str) -> Any | None:
    path = Path(workdir) / result_file
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
