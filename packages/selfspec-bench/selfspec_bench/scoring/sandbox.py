"""Running untrusted generated code: a subprocess in a temp dir, with a timeout.

Model output is never executed in-process. Each run gets a fresh temporary working
directory (tests that write files stay inside it), its own session so that a timeout
kills the whole process group (forked helpers included), a cap on file size so that
runaway printing cannot fill the disk, and an address-space cap so that runaway
allocation cannot starve the machine. Output goes to files and only the tail is read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_ADDRESS_SPACE_BYTES = 4 * 1024 * 1024 * 1024
OUTPUT_TAIL_CHARS = 4000


@dataclass(frozen=True)
class ProcessOutcome:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        """One line for ScoreResult.detail: why the run failed."""
        if self.timed_out:
            return f"timed out after {self.elapsed_s:.1f}s"
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        return f"exit code {self.returncode}" + (f": {last[:300]}" if last else "")


# Resource limits are set by a tiny exec wrapper rather than a ``preexec_fn``:
# ``preexec_fn`` is unsafe when the caller has threads (a bench run may score from a
# thread pool), while ``python -S -c`` + ``os.execvp`` costs only a few milliseconds.
_LIMIT_THEN_EXEC = (
    "import os, resource, sys\n"
    "fsize, address_space = int(sys.argv[1]), int(sys.argv[2])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))\n"
    "if address_space > 0:\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)


def _limited(argv: list[str], limit_memory: bool) -> list[str]:
    address_space = MAX_ADDRESS_SPACE_BYTES if limit_memory else 0
    return [sys.executable, "-S", "-c", _LIMIT_THEN_EXEC, str(MAX_FILE_BYTES), str(address_space), *argv]


def _child_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "TMPDIR": str(workdir),
        }
    )
    env.pop("PYTHONSTARTUP", None)
    return env


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - OUTPUT_TAIL_CHARS * 4))
        return handle.read().decode("utf-8", errors="replace")[-OUTPUT_TAIL_CHARS:]


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(
    argv: list[str], *, cwd: Path, timeout_s: float, stdin_text: str | None = None, limit_memory: bool = True
) -> ProcessOutcome:
    """Run ``argv`` in ``cwd``; on timeout kill its process group. Never raises on failure of the child."""
    stdout_path, stderr_path = Path(cwd) / ".stdout", Path(cwd) / ".stderr"
    started = time.monotonic()
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        process = subprocess.Popen(
            _limited(argv, limit_memory),
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=_child_env(Path(cwd)),
            start_new_session=True,
        )
        timed_out = False
        try:
            process.communicate(input=stdin_text.encode("utf-8") if stdin_text is not None else None, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
            process.wait()
        else:
            # Helpers the program forked and left running share its process group; the
            # group id cannot be reused while any member is alive, so this hits only them.
            _kill_group(process)
    elapsed = time.monotonic() - started
    return ProcessOutcome(
        returncode=None if timed_out else process.returncode,
        stdout=_tail(stdout_path),
        stderr=_tail(stderr_path),
        timed_out=timed_out,
        elapsed_s=elapsed,
    )


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A fresh temporary working directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="selfspec-bench-", ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def run_python_file(script: str, *, workdir: Path, timeout_s: float) -> ProcessOutcome:
    """Run ``workdir/script`` with this interpreter (so the venv's packages are importable)."""
    return run_process([sys.executable, "-B", script], cwd=workdir, timeout_s=timeout_s)
