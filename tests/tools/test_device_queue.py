"""tools/gpu/device_queue.sh: queues run in the background from a snapshot of the tree (so a device call
that re-copies the checkout cannot pull modules from under a starting command), log every line and its
exit code, and `collect` packs each queue's output. tools/gpu/device_collect.sh files what comes back."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "device_queue.sh"


def test_queue_runs_from_a_snapshot_and_collects(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "tools" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tools" / "gpu" / "device_queue.sh")
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
    env = {
        **os.environ,
        "DEVICE_QUEUE_ROOT": str(tmp_path / "out"),
        "DEVICE_QUEUE_TREES": str(tmp_path / "trees"),
        "OUT": str(tmp_path / "collected"),
        "PYTHONPATH": "/elsewhere",
    }
    (tmp_path / "collected").mkdir()
    subprocess.run(["bash", "tools/gpu/device_queue.sh", "start", "0", "q_demo.txt"], cwd=repo, env=env, check=True)
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


def test_queues_given_together_run_one_after_another(tmp_path: Path):
    """One `start` with several files chains them: the second queue's first line starts after the
    first queue is done, each from its own snapshot with its own output, and `collect` waits for both."""
    repo = tmp_path / "repo"
    (repo / "tools" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tools" / "gpu" / "device_queue.sh")
    (repo / "q_first.txt").write_text("sleep 1; date +%s%N > $Q_OUT/end.txt\n")
    (repo / "q_second.txt").write_text("date +%s%N > $Q_OUT/start.txt; basename $PWD > $Q_OUT/tree.txt\n")
    env = {
        **os.environ,
        "DEVICE_QUEUE_ROOT": str(tmp_path / "out"),
        "DEVICE_QUEUE_TREES": str(tmp_path / "trees"),
        "OUT": str(tmp_path / "collected"),
    }
    (tmp_path / "collected").mkdir()
    subprocess.run(
        ["bash", "tools/gpu/device_queue.sh", "start", "0", "q_first.txt", "q_second.txt"],
        cwd=repo,
        env=env,
        check=True,
    )
    (repo / "tools" / "gpu" / "device_queue.sh").write_text("exit 9\n")  # a later call re-copies the checkout
    result = subprocess.run(["bash", str(SCRIPT), "collect", "30"], env=env, capture_output=True, text=True, check=True)
    assert "== q_first: done" in result.stdout and "== q_second: done" in result.stdout
    out = tmp_path / "out"
    assert int((out / "q_second" / "start.txt").read_text()) >= int((out / "q_first" / "end.txt").read_text())
    assert (out / "q_second" / "tree.txt").read_text().strip() == "q_second"
    with tarfile.open(tmp_path / "collected" / "q_second.tgz") as archive:
        assert "q_second/start.txt" in archive.getnames()


def _archive(tmp_path: Path, queue_name: str, files: dict[str, str]) -> Path:
    """A queue's output as `collect` returns it: <queue>.tgz holding <queue>/..."""
    queue = tmp_path / "q" / queue_name
    for name, text in files.items():
        (queue / name).parent.mkdir(parents=True, exist_ok=True)
        (queue / name).write_text(text)
    archives = tmp_path / "archives"
    archives.mkdir(exist_ok=True)
    with tarfile.open(archives / f"{queue_name}.tgz", "w:gz") as tar:
        tar.add(queue, arcname=queue_name)
    return archives


def _repo_with_collect(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "tools" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT.parent / "device_collect.sh", repo / "tools" / "gpu" / "device_collect.sh")
    return repo


def test_collect_keeps_whole_records_only(tmp_path: Path):
    """An archive taken while a run appended can end in a torn line: device_collect.sh files the whole
    records over the committed file of the same name and drops the torn one, so the next run resumes
    from clean JSONL; logs go to the untracked review folder, not into the tree."""
    repo = _repo_with_collect(tmp_path)
    committed = repo / "benchmarks" / "topic" / "records" / "h200" / "m_b.jsonl.gz"
    committed.parent.mkdir(parents=True)
    committed.write_bytes(gzip.compress(b'{"sample_id": "a"}\n'))
    archives = _archive(
        tmp_path,
        "q_gpu0",
        {
            "status.tsv": "1\t0\t1\t0\techo\n",
            "logs/01.log": "line\r 50%|#####     | 1/2 [00:01<00:01]\rdone\n",
            "raw/m_b.jsonl": '{"sample_id": "a"}\n{"sample_id": "b"}\n{"sample_id": "c", "mo',
        },
    )
    result = subprocess.run(
        ["bash", "tools/gpu/device_collect.sh", str(archives), "batch1"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "dropped a torn line" in result.stderr
    assert gzip.open(committed, "rt").read() == '{"sample_id": "a"}\n{"sample_id": "b"}\n'
    review = repo / ".device" / "collected" / "batch1"
    assert (review / "logs" / "q_gpu0_status.tsv").exists()
    assert "50%|" not in (review / "logs" / "q_gpu0_01.log").read_text()  # progress bars dropped
    assert sorted(p.name for p in (repo / "benchmarks").rglob("*") if p.is_file()) == ["m_b.jsonl.gz"]


def test_collect_files_new_records_for_review_or_into_records_dir(tmp_path: Path):
    """A records file no topic holds yet is not guessed into a topic: it waits in the review folder,
    or goes to $RECORDS_DIR when the caller names one; other output directories wait for review."""
    repo = _repo_with_collect(tmp_path)
    archives = _archive(tmp_path, "q_gpu0", {"raw/new_run.jsonl": '{"sample_id": "a"}\n', "diag/trace.json": "{}\n"})
    subprocess.run(
        ["bash", "tools/gpu/device_collect.sh", str(archives), "batch2"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    review = repo / ".device" / "collected" / "batch2"
    assert gzip.open(review / "records" / "new_run.jsonl.gz", "rt").read() == '{"sample_id": "a"}\n'
    assert (review / "q_gpu0_diag" / "trace.json").exists()
    target = repo / "benchmarks" / "topic" / "records" / "h200"
    env = {**os.environ, "RECORDS_DIR": str(target)}
    subprocess.run(
        ["bash", "tools/gpu/device_collect.sh", str(archives), "batch3"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert gzip.open(target / "new_run.jsonl.gz", "rt").read() == '{"sample_id": "a"}\n'


def test_skip_turns_later_commands_into_comments_in_place(tmp_path: Path):
    """`skip` on a running queue: the named commands that have not started never run, the one running
    runs on, and the reader, halfway through the file, still finds the lines after them."""
    repo = tmp_path / "repo"
    (repo / "tools" / "gpu").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tools" / "gpu" / "device_queue.sh")
    (repo / "q_skip.txt").write_text(
        "# header\nsleep 2; touch $Q_OUT/one\ntouch $Q_OUT/two\n  touch $Q_OUT/three\ntouch $Q_OUT/four\n"
    )
    env = {
        **os.environ,
        "DEVICE_QUEUE_ROOT": str(tmp_path / "out"),
        "DEVICE_QUEUE_TREES": str(tmp_path / "trees"),
        "OUT": str(tmp_path / "collected"),
    }
    (tmp_path / "collected").mkdir()
    subprocess.run(["bash", "tools/gpu/device_queue.sh", "start", "0", "q_skip.txt"], cwd=repo, env=env, check=True)
    qout = tmp_path / "out" / "q_skip"
    for _ in range(50):  # until the first command has started
        if (qout / "logs" / "01.log").exists():
            break
        time.sleep(0.05)
    size = (qout / "queue.txt").stat().st_size
    result = subprocess.run(
        ["bash", str(SCRIPT), "skip", "q_skip", "1", "3", "7"], env=env, capture_output=True, text=True, check=True
    )
    assert "command 1 has started" in result.stdout
    assert "command 3 will not run" in result.stdout and "no command 7" in result.stdout
    assert (qout / "queue.txt").stat().st_size == size
    for _ in range(100):
        if (qout / "done").exists():
            break
        time.sleep(0.1)
    assert sorted(p.name for p in qout.iterdir() if p.is_file() and p.name in {"one", "two", "three", "four"}) == [
        "four",
        "one",
        "two",
    ]
    bad = subprocess.run(["bash", str(SCRIPT), "skip", "no_such_queue", "1"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2
