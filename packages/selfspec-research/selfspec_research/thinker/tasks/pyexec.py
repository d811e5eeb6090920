"""Run candidate Python classes against unit tests in a separate, time-limited process.

Answers come from a model, so they are untrusted code: they may loop forever, exhaust
memory, print megabytes, call `sys.exit` or `os._exit`. None of that may touch the
evaluating process, so candidates never run in-process. One subprocess runs a *batch*
of jobs (starting Python costs ~50 ms, a test costs microseconds), each job under its
own alarm; jobs the batch could not report on (the process died or ran out of time)
are retried alone, so one runaway answer costs only its own verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

# The harness runs inside the child. It reads jobs from argv[1] and appends one JSON
# line per finished job to argv[2], so a crash mid-batch still leaves earlier verdicts.
_HARNESS = r"""
import ast, builtins, contextlib, io, json, math, signal, sys

class _JobTimeout(BaseException):
    pass

def _on_alarm(signum, frame):
    raise _JobTimeout()

def _same(value, expected):
    if isinstance(expected, float) or isinstance(value, float):
        if isinstance(value, bool) or isinstance(expected, bool):
            return value == expected
        if isinstance(value, (int, float)) and isinstance(expected, (int, float)):
            return math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-6)
        return False
    if isinstance(expected, (list, tuple)):
        return (type(value) is type(expected) and len(value) == len(expected)
                and all(_same(v, e) for v, e in zip(value, expected)))
    if isinstance(expected, dict):
        return (isinstance(value, dict) and value.keys() == expected.keys()
                and all(_same(value[k], expected[k]) for k in expected))
    return value == expected

def _run_test(namespace, test):
    scope = dict(namespace)
    try:
        for statement in test["setup"]:
            exec(statement, scope)
        value = eval(test["expr"], scope)
    except _JobTimeout:
        raise
    except BaseException as exc:
        wanted = test.get("raises")
        if wanted and isinstance(exc, getattr(builtins, wanted, ())):
            return True, ""
        return False, f"{test['expr']}: raised {type(exc).__name__}: {exc}"[:300]
    if test.get("raises"):
        return False, f"{test['expr']}: expected {test['raises']}, got {value!r}"[:300]
    expected = ast.literal_eval(test["expected"])
    if _same(value, expected):
        return True, ""
    return False, f"{test['expr']}: expected {test['expected']}, got {value!r}"[:300]

def _run_job(job):
    n = len(job["tests"])
    namespace = {"__name__": "candidate", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<candidate>", "exec"), namespace)
    except _JobTimeout:
        raise
    except BaseException as exc:
        return [False] * n, [f"code does not load: {type(exc).__name__}: {exc}"[:300]]
    if not isinstance(namespace.get(job["class_name"]), type):
        return [False] * n, [f"class {job['class_name']} is not defined"]
    passed, errors = [], []
    for test in job["tests"]:
        ok, error = _run_test(namespace, test)
        passed.append(ok)
        if error and len(errors) < 5:
            errors.append(error)
    return passed, errors

def main():
    with open(sys.argv[1], encoding="utf-8") as fh:
        jobs = json.load(fh)
    out = open(sys.argv[2], "a", encoding="utf-8")
    signal.signal(signal.SIGALRM, _on_alarm)
    for job in jobs:
        sink = io.StringIO()
        signal.setitimer(signal.ITIMER_REAL, job["timeout_s"])
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                passed, errors = _run_job(job)
        except _JobTimeout:
            passed, errors = [False] * len(job["tests"]), ["timed out"]
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps({"id": job["id"], "passed": passed, "errors": errors}) + "\n")
        out.flush()

main()
"""


@dataclass(frozen=True)
class UnitTest:
    """One test: run `setup` statements, evaluate `expr`, compare with `expected`.

    `expected` is a Python literal (`repr` of the reference value) read back with
    `ast.literal_eval`; `raises` names a builtin exception the test expects instead.
    """

    setup: tuple[str, ...]
    expr: str
    expected: str | None = None
    raises: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {"setup": list(self.setup), "expr": self.expr, "expected": self.expected, "raises": self.raises}

    @classmethod
    def from_dict(cls, data: dict) -> "UnitTest":
        return cls(tuple(data["setup"]), data["expr"], data.get("expected"), data.get("raises"))


@dataclass
class JobResult:
    """Per-test verdicts for one candidate, plus the first few failure messages."""

    passed: list[bool]
    errors: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _limit_resources(memory_bytes: int, cpu_s: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))


def _run_batch(jobs: list[dict], timeout_s: float, memory_bytes: int) -> dict[int, JobResult]:
    with tempfile.TemporaryDirectory(prefix="selfspec-pyexec-") as workdir:
        jobs_path = os.path.join(workdir, "jobs.json")
        results_path = os.path.join(workdir, "results.jsonl")
        with open(jobs_path, "w", encoding="utf-8") as fh:
            json.dump(jobs, fh)
        cpu_s = int(timeout_s) + 2
        try:
            subprocess.run(
                [sys.executable, "-I", "-c", _HARNESS, jobs_path, results_path],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                preexec_fn=lambda: _limit_resources(memory_bytes, cpu_s),
                check=False,
            )
        except subprocess.TimeoutExpired:
            pass  # whatever the harness reported before the deadline still counts
        results: dict[int, JobResult] = {}
        if os.path.exists(results_path):
            with open(results_path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a torn last line from a killed process
                    results[int(record["id"])] = JobResult(list(record["passed"]), list(record["errors"]))
        return results


def run_class_tests(
    codes: Sequence[str],
    class_names: Sequence[str],
    tests: Sequence[Sequence[UnitTest]],
    job_timeout_s: float = 3.0,
    memory_bytes: int = 1 << 30,
) -> list[JobResult]:
    """Run each candidate `codes[i]` against `tests[i]`; one verdict list per candidate.

    All candidates share one subprocess; those it did not report on are rerun alone.
    """
    if not len(codes) == len(class_names) == len(tests):
        raise ValueError("codes, class_names and tests must have the same length")
    jobs = [
        {
            "id": i,
            "code": code,
            "class_name": name,
            "tests": [test.to_dict() for test in job_tests],
            "timeout_s": job_timeout_s,
        }
        for i, (code, name, job_tests) in enumerate(zip(codes, class_names, tests))
    ]
    if not jobs:
        return []
    # A batch of well-behaved answers takes well under a second; the budget leaves room
    # for two answers that hit their alarm. Past it, unreported jobs are retried alone.
    batch_timeout_s = 5.0 + 2 * job_timeout_s + 0.05 * len(jobs)
    results = _run_batch(jobs, timeout_s=batch_timeout_s, memory_bytes=memory_bytes)
    for job in jobs:
        if job["id"] not in results:
            results.update(_run_batch([job], timeout_s=2.0 + job_timeout_s, memory_bytes=memory_bytes))
    return [results.get(job["id"], JobResult([False] * len(job["tests"]), ["the test process died"])) for job in jobs]
