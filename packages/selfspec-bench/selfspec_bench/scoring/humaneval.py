"""HumanEval: run the completed function against the problem's ``check``.

The program is the problem prompt (its imports and helper functions), then the
model's code, then the test, then ``check(entry_point)``; passed = exit code 0. The
reply may hold a whole function (what our prompt asks for: it is appended after the
prompt and redefines the stub) or only a body (the classic completion format, as in
``canonical_solution``: it continues the prompt).
"""

from __future__ import annotations

import re
import textwrap

from ..datasets.sample import BenchSample
from .extract import pick_code
from .harness import LAUNCHER_FILE, plain_launcher, write_candidate
from .result import ScoreResult, binary
from .sandbox import run_python_file, scratch_dir

PYTHON_FENCES = ("python", "py", "python3", "")


def has_top_level_def(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def assemble_program(prompt: str, code: str, entry_point: str) -> str:
    """Prompt + whole function (or prompt + indented body), ready for the test to be appended."""
    code = textwrap.dedent(code).strip("\n")
    if has_top_level_def(code, entry_point):
        return f"{prompt.rstrip()}\n\n\n{code}\n"
    body = textwrap.indent(code, "    ")
    return f"{prompt}{body}\n"


def score_humaneval(sample: BenchSample, completion_text: str, *, timeout_s: float = 10.0) -> ScoreResult:
    ref = sample.reference
    entry_point = ref["entry_point"]
    code = pick_code(completion_text, languages=PYTHON_FENCES, must_match=rf"def\s+{re.escape(entry_point)}\s*\(")
    program = assemble_program(ref["prompt"], code, entry_point) + f"\n\n{ref['test']}\n\ncheck({entry_point})\n"
    with scratch_dir() as workdir:
        write_candidate(workdir, program, plain_launcher())
        outcome = run_python_file(LAUNCHER_FILE, workdir=workdir, timeout_s=timeout_s)
    return binary(outcome.ok, "all checks passed" if outcome.ok else outcome.describe())
