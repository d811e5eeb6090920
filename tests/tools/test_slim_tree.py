"""tools/gpu/slim_tree.sh: the weights a GPU block does not load leave the working tree (so a device call
carries two model parts) without git ever recording their deletion, and come back whole."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "slim_tree.sh"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    files = {
        "packages/selfspec-weights/w/adapters/keep-me/adapter_model.safetensors": b"k" * 64,
        "packages/selfspec-weights/w/adapters/old/adapter_model.safetensors": b"o" * 64,
        "packages/selfspec-weights/w/drafts/draft-l8/adapter_model.safetensors": b"d" * 64,
        "benchmarks/cospec/arbitrator/head.safetensors": b"h" * 64,
        "benchmarks/topic/records/h100/run.jsonl.gz": b"r" * 64,
        "benchmarks/topic/README.md": b"topic\n",
        "README.md": b"project\n",
    }
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo


def test_out_keeps_the_named_weights_and_in_restores_the_rest(tmp_path: Path):
    repo = _repo(tmp_path)
    subprocess.run(["bash", str(SCRIPT), "out", "keep-me"], cwd=repo, check=True, capture_output=True)
    weights = repo / "packages/selfspec-weights/w"
    assert (weights / "adapters/keep-me/adapter_model.safetensors").exists()
    assert not (weights / "adapters/old/adapter_model.safetensors").exists()
    assert not (weights / "drafts/draft-l8/adapter_model.safetensors").exists()
    assert not (repo / "benchmarks/cospec/arbitrator/head.safetensors").exists()
    assert _git(repo, "status", "--short") == ""  # nothing for a commit to record
    marked = [line[2:] for line in _git(repo, "ls-files", "-v").splitlines() if line.startswith("S ")]
    assert len(marked) == 3 and not any("keep-me" in name for name in marked)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "during the block", "--allow-empty")
    assert "adapters/old/adapter_model.safetensors" in _git(repo, "ls-files")  # still tracked
    subprocess.run(["bash", str(SCRIPT), "in"], cwd=repo, check=True, capture_output=True)
    assert (weights / "adapters/old/adapter_model.safetensors").read_bytes() == b"o" * 64
    assert (repo / "benchmarks/cospec/arbitrator/head.safetensors").read_bytes() == b"h" * 64
    assert _git(repo, "status", "--short") == ""
    assert "S " not in _git(repo, "ls-files", "-v")  # no skip-worktree mark left


def test_out_without_names_is_refused(tmp_path: Path):
    repo = _repo(tmp_path)
    run = subprocess.run(["bash", str(SCRIPT), "out"], cwd=repo, capture_output=True, text=True)
    assert run.returncode == 2 and "usage" in run.stderr
    assert (repo / "packages/selfspec-weights/w/adapters/old/adapter_model.safetensors").exists()


def test_records_leave_with_the_flag_and_come_back(tmp_path: Path):
    repo = _repo(tmp_path)
    record = repo / "benchmarks/topic/records/h100/run.jsonl.gz"
    subprocess.run(["bash", str(SCRIPT), "out", "keep-me"], cwd=repo, check=True, capture_output=True)
    assert record.exists()  # without --records the records stay
    subprocess.run(["bash", str(SCRIPT), "out", "--records", "__none__"], cwd=repo, check=True, capture_output=True)
    assert not record.exists() and (repo / "benchmarks/topic/README.md").exists()
    assert not (repo / "packages/selfspec-weights/w/adapters/keep-me/adapter_model.safetensors").exists()
    assert _git(repo, "status", "--short") == ""
    subprocess.run(["bash", str(SCRIPT), "in"], cwd=repo, check=True, capture_output=True)
    assert record.read_bytes() == b"r" * 64
    assert _git(repo, "status", "--short") == "" and "S " not in _git(repo, "ls-files", "-v")
