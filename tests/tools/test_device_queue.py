"""scripts/device_queue.sh: queues run in the background from a snapshot of the tree (so a device call
that re-copies the checkout cannot pull modules from under a starting command, as in session 8), log
every line and its exit code, and `collect` packs each queue's output."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_queue.sh"


def test_queue_runs_from_a_snapshot_and_collects(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "scripts" / "device_queue.sh")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "answer.txt").write_text("42\n")
    (repo / ".device").mkdir()
    (repo / ".device" / "part00").write_text("model bytes\n")
    (repo / "q_demo.txt").write_text(
        "# a comment, skipped\n"
        "sleep 1; pwd > $Q_OUT/where.txt; cat pkg/answer.txt > $Q_OUT/answer.txt\n"
        "ls .device > $Q_OUT/device.txt; echo $PYTHONPATH > $Q_OUT/pythonpath.txt\n"
        "exit 3\n"
    )
    env = {**os.environ, "DEVICE_QUEUE_ROOT": str(tmp_path / "out"), "DEVICE_QUEUE_TREES": str(tmp_path / "trees"),
           "OUT": str(tmp_path / "collected"), "PYTHONPATH": "/elsewhere"}
    (tmp_path / "collected").mkdir()
    subprocess.run(["bash", "scripts/device_queue.sh", "start", "0", "q_demo.txt"], cwd=repo, env=env, check=True)
    shutil.rmtree(repo / "pkg")  # the checkout changes under the running queue (a later device call)
    qout = tmp_path / "out" / "q_demo"
    for _ in range(100):
        if (qout / "done").exists():
            break
        time.sleep(0.1)
    assert (qout / "done").exists()
    snapshot = tmp_path / "trees" / "q_demo"
    assert (qout / "where.txt").read_text().strip() == str(snapshot)
    assert (qout / "answer.txt").read_text() == "42\n"  # read from the snapshot, not the changed checkout
    assert (qout / "device.txt").read_text().strip() == "part00"  # .device is linked, not copied
    assert (snapshot / ".device").is_symlink()
    assert (qout / "pythonpath.txt").read_text().strip() == f"{snapshot}:/elsewhere"
    status = [line.split("\t") for line in (qout / "status.tsv").read_text().splitlines()]
    assert [(row[0], row[3]) for row in status] == [("1", "0"), ("2", "0"), ("3", "3")]
    result = subprocess.run(["bash", str(SCRIPT), "collect", "5"], env=env, capture_output=True, text=True, check=True)
    assert "== q_demo: done" in result.stdout
    with tarfile.open(tmp_path / "collected" / "q_demo.tgz") as archive:
        assert "q_demo/status.tsv" in archive.getnames()


def test_collect_keeps_whole_records_only(tmp_path: Path):
    """An archive taken while a run appended can end in a torn line (session 11): device_collect.sh
    files the whole records and drops the torn one, so the next session resumes from clean JSONL."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT.parent / "device_collect.sh", repo / "scripts" / "device_collect.sh")
    queue = tmp_path / "q" / "s_gpu0"
    (queue / "raw").mkdir(parents=True)
    (queue / "status.tsv").write_text("1\t0\t1\t0\techo\n")
    (queue / "raw" / "m_b.jsonl").write_text('{"sample_id": "a"}\n{"sample_id": "b"}\n{"sample_id": "c", "mo')
    archives = tmp_path / "archives"
    archives.mkdir()
    with tarfile.open(archives / "s_gpu0.tgz", "w:gz") as tar:
        tar.add(queue, arcname="s_gpu0")
    result = subprocess.run(["bash", "scripts/device_collect.sh", str(archives), "s99"], cwd=repo,
                            capture_output=True, text=True, check=True)
    assert "dropped a torn line" in result.stderr
    import gzip

    filed = gzip.open(repo / "benchmarks/results/h200/raw/m_b.jsonl.gz", "rt").read()
    assert filed == '{"sample_id": "a"}\n{"sample_id": "b"}\n'
