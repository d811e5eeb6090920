"""Held-out items of the thinker's task families as benchmarks (`thinker/<family>`).

Why: SSR pays off when a model's answer takes shape while it thinks. The small public models
here do not reason, but `smollm2-thinker` was trained to on these generated families, so
its held-out items are the workload on which SSR can be measured honestly at natural
lengths — and the items' checkers grade the answers. Items come from the generators
(seeded, never from benchmark files): stream `seed` (default 1000, the held-out stream the
thinker eval uses; training uses 0), the knobs of `data_version`. A JSONL file of saved
items (`TaskItem.to_dict()` per line) can be given instead with `path`.

The bench harness finds these through the `selfspec_bench.benchmarks` entry point, which
calls `register`: the harness itself never imports the research code.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from selfspec_bench.datasets.paths import require_file
from selfspec_bench.datasets.sample import BenchSample, apply_window, user_message
from selfspec_bench.scoring.result import ScoreResult
from selfspec_research.thinker.data_versions import DATA_VERSION, HELDOUT_SEED, TRAIN_SEED, data_version_knobs
from selfspec_research.thinker.tasks import TaskItem, check, families, get_family

DEFAULT_ITEMS = 40


def load_thinker_task(
    family: str,
    *,
    path: str | Path | None = None,
    limit: int | None = None,
    offset: int = 0,
    seed: int | None = None,
    data_version: str | None = None,
) -> list[BenchSample]:
    """`limit` (default 40) held-out items of `family`, from index `offset` on."""
    benchmark = f"thinker/{family}"
    if path is not None:
        source = require_file(Path(path), what=f"{benchmark} items", option="path=")
        items = []
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = TaskItem.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{source}:{number}: not a thinker task item ({exc})") from None
            if item.family == family:
                items.append(item)
        items = apply_window(items, limit, offset)
    else:
        seed = HELDOUT_SEED if seed is None else int(seed)
        if seed == TRAIN_SEED:
            raise ValueError(f"seed {seed} is the thinker's training stream; benchmark on held-out seeds")
        knobs = data_version_knobs(data_version or DATA_VERSION).get(family, {})
        generator = get_family(family, **knobs)
        count = DEFAULT_ITEMS if limit is None else limit
        if offset < 0 or count < 0:
            raise ValueError(f"offset and limit must be >= 0, got {offset}, {count}")
        items = [generator.generate(seed, index) for index in range(offset, offset + count)]
    return [
        BenchSample(
            id=item.uid, benchmark=benchmark, messages=user_message(item.prompt), reference={"item": item.to_dict()}
        )
        for item in items
    ]


def score_thinker(sample: BenchSample, completion: str, *, timeout_s: float = 10.0) -> ScoreResult:
    """`passed` = the checker's all-or-nothing verdict; `score` = its partial credit."""
    result = check(TaskItem.from_dict(sample.reference["item"]), completion)
    return ScoreResult(passed=bool(result.passed), score=float(result.score), detail=result.detail[:200])


def register(add_benchmark) -> None:
    """Entry point: one `thinker/<family>` benchmark per task family."""
    for family in families():
        add_benchmark(f"thinker/{family}", partial(load_thinker_task, family), score_thinker)
