"""Reading ``.jsonl`` / ``.jsonl.gz`` files, the format of both wheels' data files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Yield one dict per non-blank line; gzip is detected by the ``.gz`` suffix."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(path))
