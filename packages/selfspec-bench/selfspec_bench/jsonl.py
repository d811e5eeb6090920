"""The harness's one JSONL reader and writer: dataset files, bench records, `.jsonl.gz` alike.

Why one module: the datasets, the runner's resume and the report all read JSON lines, and
they must agree on the format (UTF-8, blank lines ignored, gzip by the `.gz` suffix, since
committed raw results are kept compressed: 5-10x smaller, and the tree travels to the GPU
machine with every call). What differs is only what a line that is not JSON means to the
caller, so that is the one choice `iter_jsonl` leaves open (`bad_lines`).

The writer keeps the invariant the readers rely on: every line of a records file is a whole
record, except perhaps the last one while a writer is still writing it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Literal

BadLines = Literal["raise", "skip-last", "skip"]


class JsonlError(ValueError):
    """A line of a JSONL file that is not JSON; the message names the file and the line."""


def open_text(path: Path) -> IO[str]:
    """`path` opened for reading as UTF-8 text, decompressed when its name ends in `.gz`."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_jsonl(path: Path, *, bad_lines: BadLines = "raise") -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line of `path`.

    `bad_lines` says what a line that is not JSON is: "raise" (a `JsonlError`: a data file
    must be whole), "skip-last" (skipped if it is the file's last line, which a writer may be
    writing right now, else a `JsonlError`: dropping data silently would bias the means), or
    "skip" (skipped anywhere: a resumed run redoes whatever it cannot read)."""
    with open_text(path) as handle:
        pending: tuple[int, json.JSONDecodeError] | None = None  # a bad line, until we know if it is the last
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            if pending is not None:
                raise _error(path, *pending)
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                if bad_lines == "raise":
                    raise _error(path, lineno, exc) from None
                if bad_lines == "skip-last":
                    pending = (lineno, exc)
                continue
            yield lineno, value


def read_jsonl(path: Path, *, bad_lines: BadLines = "raise") -> list[Any]:
    """Every value of `path` (`iter_jsonl`) in file order, without line numbers."""
    return [value for _, value in iter_jsonl(path, bad_lines=bad_lines)]


def _error(path: Path, lineno: int, exc: json.JSONDecodeError) -> JsonlError:
    return JsonlError(f"{path}:{lineno}: not JSON ({exc})")


def append_jsonl(path: Path, records: Iterable[Any]) -> None:
    """Append one JSON line per record, in a single write.

    A file whose last line is unfinished (a writer killed mid-write) loses that line first:
    it holds part of a record no reader can use, and a record appended after it would
    otherwise be glued onto it, or leave it mid-file where readers that skip only a bad last
    line stop. A last line that is whole JSON but lacks its newline only gets the newline."""
    path = Path(path)
    text = "".join(json.dumps(record) + "\n" for record in records)
    if path.exists() and path.stat().st_size:
        _finish_last_line(path)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)


def _finish_last_line(path: Path, chunk: int = 1 << 16) -> None:
    """End the file with a newline, dropping an unfinished last line (read from the end: records files run to MBs)."""
    with path.open("rb+") as handle:
        end = handle.seek(0, 2)
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            return
        tail, start = b"", end
        while start > 0 and b"\n" not in tail:
            start = max(0, start - chunk)
            handle.seek(start)
            tail = handle.read(end - start)
        line_start = start + tail.rfind(b"\n") + 1  # rfind gives -1 where the first line is the unfinished one
        handle.seek(line_start)
        try:
            json.loads(handle.read())
        except ValueError:  # JSONDecodeError, or UnicodeDecodeError for a character cut in two
            handle.truncate(line_start)
        else:
            handle.write(b"\n")
