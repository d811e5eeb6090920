"""The eval's append-only progress file (`partial.jsonl` beside the results)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Journal:
    """The eval's append-only progress file (`partial.jsonl` beside the results).

    Why: an eval can be killed part-way (a job's time limit, a machine taken back). Every
    finished run (with its full answer text, so it can be scored later) and every finished
    task is on disk, and a re-run with the same config resumes there instead of starting
    over.
    """

    def __init__(self, path: Path | None, identity: dict[str, Any]) -> None:
        self.path = path
        identity = json.loads(json.dumps(identity))  # as it reads back (tuples become lists)
        self.runs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        if path is None:
            return
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):
                with path.open("a") as handle:  # close the cut line: the next record starts on its own
                    handle.write("\n")
            lines = []
            for line in text.splitlines():
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by the kill this journal exists for: that run is redone
            if lines and lines[0].get("identity") != identity:
                raise ValueError(
                    f"{path} was written by an eval with another config, model or arbitrator; remove it or use another --out"
                )
            for line in lines[1:]:
                if line["kind"] == "run":
                    self.runs[(line["task"], line["uid"], line["label"])] = line
                elif line["kind"] == "task_done":
                    self.tasks[line["task"]] = line
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "journal", "identity": identity})

    def _append(self, line: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(json.dumps(line) + "\n")

    def run_done(self, record: dict[str, Any], answer: str) -> None:
        self._append({**record, "kind": "run", "answer": answer})

    def task_done(self, task: str, **parts: Any) -> None:
        self._append({"kind": "task_done", "task": task, **parts})


__all__ = ["Journal"]
