"""tools/gpu/vllm_parts.sh: vLLM's wheels carried in eight parts, joined only when all are there and
their sha256 matches, and unpacked as pip would install them (a wheel's `.data/purelib` at the top)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "vllm_parts.sh"

pytestmark = pytest.mark.skipif(shutil.which("split") is None, reason="needs coreutils")


def _parts(repo: Path, tmp_path: Path) -> None:
    """.device/vparts/part0..7 and the sha256 of a tar holding one small wheel."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "demo-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("demo/__init__.py", "VALUE = 42\n")
        whl.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
        whl.writestr("demo-1.0.data/purelib/demo_extra.py", "EXTRA = 1\n")
        whl.writestr("demo-1.0.data/scripts/demo-cli", "#!/bin/sh\n")
    tar_path = tmp_path / "vllm.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(wheels, arcname=".")
    parts = repo / ".device" / "vparts"
    parts.mkdir(parents=True)
    subprocess.run(["split", "-n", "8", "-d", "-a", "1", str(tar_path), str(parts / "part")], check=True)
    (parts / "vllm.tar.sha256").write_text(hashlib.sha256(tar_path.read_bytes()).hexdigest() + "\n")


def _run(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True)


def test_parts_are_joined_checked_and_unpacked(tmp_path: Path):
    repo = tmp_path / "repo"
    _parts(repo, tmp_path)
    there = tmp_path / "there"
    env = {**os.environ, "VLLM_PARTS_TMP": str(there)}
    kept = repo / ".device" / "vparts"
    held = {p.name: p.read_bytes() for p in kept.iterdir()}
    for p in kept.iterdir():
        p.unlink()
    # Parts arrive one call at a time: install refuses until all eight are there.
    for name in ["part0", "part1", "part2"]:
        (kept / name).write_bytes(held[name])
    assert "3 of 8 parts kept" in _run(repo, env, "collect").stdout
    early = _run(repo, env, "install")
    assert early.returncode == 1 and "3 of 8" in early.stderr
    # A wrong part is caught by the sha256, and nothing is installed.
    for name, data in held.items():
        (kept / name).write_bytes(data if name != "part5" else data[:-1] + b"?")
    _run(repo, env, "collect")
    bad = _run(repo, env, "install")
    assert bad.returncode == 1 and "sha256" in bad.stderr and not (there / "vsite" / ".vllm-installed").exists()
    (kept / "part5").write_bytes(held["part5"])
    _run(repo, env, "collect")
    done = _run(repo, env, "install")
    assert done.returncode == 0, done.stderr
    site = there / "vsite"
    assert (site / "demo" / "__init__.py").read_text() == "VALUE = 42\n"
    assert (site / "demo_extra.py").exists() and not list(site.glob("*.data"))
    assert (site / "demo-1.0.dist-info" / "METADATA").exists()
    assert "already installed" in _run(repo, env, "install").stdout
