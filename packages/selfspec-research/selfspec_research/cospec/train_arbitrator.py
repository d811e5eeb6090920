"""Training the CoSpec arbitrator for real: checker-labelled SFT, then PPO over full CoSpec rollouts.

`train_arbitrator(TrainConfig(...))` (CLI: `selfspec cospec train-arbitrator`, `train_cli.py`)
runs four phases on one LLM with a shallow self-draft, and saves a checkpoint that
`selfspec cospec eval --arbitrator` loads. Each phase has its own module:

1. **Collection** (`arbitrator_states.collect_states`): greedy SpS rollouts over the
   TRAINING items only (`arbitrator_data`: the thinker's training stream past the items
   the thinker adapter saw, and GSM8K problems the checkpoint lists so the eval excludes
   them) record every first mismatch of a round; a seeded sample of them is kept.
2. **Counterfactual labels** (`arbitrator_states.label_states`): at each state the target
   continues from the draft token and from its own token, both outputs are scored by the
   item's checker, and the better branch is the label (ties: a likelihood-gain rule).
3. **SFT** (`arbitrator_sft.run_sft`): binary cross-entropy on the labelled states.
4. **RL** (`arbitrator_rl.rl_iteration`): PPO-clip over full CoSpec rollouts with sampled
   keep decisions, rewarded by score and speed, advantages centred per prompt group.

Time budget (`time_budget_s`, model loading included): of what is left after loading, the
phases end by 25% / 50% / 60% (collection / labelling / SFT; unused time moves on), RL uses
the rest and skips an iteration that the remaining time cannot hold (measured on the
previous one). Running sequences are cancelled at a deadline: a cut collection keeps the
states it recorded, a cut labelling drops the states whose branches did not finish, a cut
RL iteration is not used. The run always saves.

Resumable: `out/` holds `config.json`, `labels.jsonl` (the labelled states), `sft/` (the SFT
arbitrator, the KL reference), `checkpoint/` (the latest arbitrator, saved after SFT and
after every RL iteration), `trainer_state.json` + `trainer_state.pt` (phase, iteration,
optimizer state) and `log.jsonl` (one JSON line per SFT step / RL update / phase event).
`resume=True` continues from there (same data options required); without it a used `out/`
is refused.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from selfspec.server.cli import load_llm
from selfspec.spec.cospec.arbitrator import Arbitrator
from selfspec.spec.cospec.checkpoint import load_arbitrator, save_arbitrator
from selfspec_research.cospec.arbitrator_config import TrainConfig
from selfspec_research.cospec.arbitrator_data import data_record, training_tasks
from selfspec_research.cospec.arbitrator_rl import rl_iteration, rl_prompts_for
from selfspec_research.cospec.arbitrator_sft import ADAMW_WEIGHT_DECAY, run_sft
from selfspec_research.cospec.arbitrator_states import LabelledState, collect_states, label_states
from selfspec_research.cospec.eval_tasks import EvalTask
from selfspec_research.cospec.rollouts import fits
from selfspec_research.cospec.training import frozen_copy

PHASE_SHARES = {"collect": 0.25, "label": 0.50, "sft": 0.60}
"""Cumulative share of the time budget by which each phase must end (RL: the rest)."""
SAVE_RESERVE_S = 5.0
"""Seconds (at most 5% of the budget) kept back from the phases for the final save."""


@dataclass
class TrainResult:
    """Where the run lives, its final checkpoint, and the stats of its phases."""

    out: Path
    checkpoint: Path
    stats: dict[str, Any] = field(default_factory=dict)


class _Log:
    """`log.jsonl`: one timestamped JSON line per record."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")


def _device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32"  # LoRA + Adam in fp32; a 135M target is cheap enough
    return device, dtype


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def train_arbitrator(
    config: TrainConfig, llm=None, *, tasks: Sequence[EvalTask] | None = None, echo: Callable[[str], None] = print
) -> TrainResult:
    """Run (or resume) the whole pipeline (module doc). `llm`/`tasks` override loading (tests)."""
    started = time.monotonic()
    budget = config.time_budget_s
    deadline_all = None if budget is None else started + max(0.0, budget - min(SAVE_RESERVE_S, 0.05 * budget))

    loaded = started  # set again once the model is loaded: the phases share what is left then

    def phase_deadline(name: str) -> float | None:
        if deadline_all is None:
            return None
        return min(deadline_all, loaded + PHASE_SHARES[name] * max(0.0, deadline_all - loaded))

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state_file, state_pt = out / "trainer_state.json", out / "trainer_state.pt"
    command = config.command or shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    if state_file.exists() and not config.resume:
        raise ValueError(f"{out} holds a training run (trainer_state.json); pass resume or another out directory")
    if config.resume and (out / "config.json").exists():
        previous = json.loads((out / "config.json").read_text())
        if previous.get("data_key") != config.data_key():
            raise ValueError(f"resume: {out} was trained with other data options {previous.get('data_key')}")
    _write_json(
        out / "config.json",
        {"config": config.model_dump(mode="json"), "data_key": config.data_key(), "command": command},
    )
    trainer = json.loads(state_file.read_text()) if config.resume and state_file.exists() else {}
    log = _Log(out / "log.jsonl")
    torch.manual_seed(config.seed)

    if llm is None:
        device, dtype = _device_and_dtype(config.device, config.dtype)
        echo(f"loading {config.target} with draft {config.draft} on {device} ({dtype})")
        llm = load_llm(
            config.target,
            device=device,
            dtype=dtype,
            num_slots=config.num_slots,
            max_len=config.max_len,
            draft=config.draft,
        )
    if getattr(llm, "draft_runner", None) is None:
        llm.set_draft(config.draft)
    draft_model = llm.draft_runner.model
    loaded = time.monotonic()
    stats_load_s = round(loaded - started, 2)
    target_name = getattr(llm, "model_name", config.target)
    tasks = list(tasks) if tasks is not None else training_tasks(config)
    data = data_record(config, tasks)
    stats: dict[str, Any] = dict(trainer.get("stats", {}))
    stats["load_s"] = stats_load_s
    stopped = False

    def training_facts() -> dict[str, Any]:
        return {
            **data,
            "command": command,
            "config": config.model_dump(mode="json", exclude={"command"}),
            "phase": trainer.get("phase", "init"),
            "sft_steps": trainer.get("sft_steps", 0),
            "rl_iterations": trainer.get("rl_iterations", 0),
            "stopped_by_time_budget": stopped,
            "stats": stats,
        }

    def save(arb: Arbitrator, where: Path, optimizer: torch.optim.Optimizer | None = None) -> Path:
        path = save_arbitrator(arb, where, draft=config.draft, target=target_name, training=training_facts())
        if where.name == "checkpoint":
            if optimizer is not None:
                torch.save({"optimizer": optimizer.state_dict(), "phase": trainer.get("phase")}, state_pt)
            trainer["stats"] = stats
            _write_json(state_file, trainer)
        return path

    # ------------------------------------------------------------ data
    labels_file = out / "labels.jsonl"
    if config.resume and labels_file.exists():
        examples = [
            LabelledState.from_json(json.loads(line)) for line in labels_file.read_text().splitlines() if line.strip()
        ]
        echo(f"resume: {len(examples)} labelled states from {labels_file}")
    else:
        collected, collect_stats = collect_states(
            llm, tasks, config, deadline=phase_deadline("collect"), progress=config.progress
        )
        stats["collect"] = collect_stats
        log({"phase": "collect", **collect_stats})
        stopped |= collect_stats["cancelled_rollouts"] > 0
        echo(f"collected {collect_stats['states']} states from {collect_stats['rollouts']} SpS rollouts")
        examples, label_stats = label_states(
            llm, collected, tasks, config, deadline=phase_deadline("label"), progress=config.progress
        )
        stats["label"] = label_stats
        log({"phase": "label", **label_stats})
        stopped |= label_stats["dropped_by_deadline"] > 0
        echo(f"labelled {label_stats['labelled']} states ({label_stats['decisive']} decisive by the checker)")
        labels_file.write_text("".join(json.dumps(x.to_json()) + "\n" for x in examples))

    # ------------------------------------------------------------ SFT
    sft_dir = out / "sft"
    if trainer.get("sft_done") and (out / "checkpoint").exists():
        arbitrator = load_arbitrator(out / "checkpoint", draft_model)
        reference = frozen_copy(load_arbitrator(sft_dir, draft_model)) if sft_dir.exists() else frozen_copy(arbitrator)
        echo(f"resume: arbitrator after {trainer.get('rl_iterations', 0)} RL iterations")
    else:
        arbitrator = Arbitrator.from_draft(draft_model, seed=config.seed)
        deadline = phase_deadline("sft")
        sft_stats = run_sft(arbitrator, examples, config, deadline=deadline, log=log, progress=config.progress)
        stats["sft"] = sft_stats
        stopped |= sft_stats["stopped_by_time_budget"]
        log({"phase": "sft_done", **sft_stats})
        echo(f"SFT: {sft_stats['steps']} steps, BCE {sft_stats['bce_before']:.4f} -> {sft_stats['bce_after']:.4f}")
        trainer.update(phase="sft", sft_done=True, sft_steps=sft_stats["steps"], rl_iterations=0)
        save(arbitrator, sft_dir)
        save(arbitrator, out / "checkpoint")
        reference = frozen_copy(arbitrator)

    # ------------------------------------------------------------ RL
    optimizer = torch.optim.AdamW(arbitrator.trainable_parameters(), lr=config.rl_lr, weight_decay=ADAMW_WEIGHT_DECAY)
    if config.resume and state_pt.exists():
        saved = torch.load(state_pt, map_location="cpu", weights_only=False)
        if saved.get("phase") == "rl":
            optimizer.load_state_dict(saved["optimizer"])
    fitting = {(t.name, item.uid): fits(llm, item, t.thinking) for t in tasks for item in t.items}
    start_iteration = int(trainer.get("rl_iterations", 0))
    last_duration = 0.0
    bar = tqdm(
        total=config.rl_iterations,
        initial=min(start_iteration, config.rl_iterations),
        desc="RL (PPO)",
        unit="iter",
        disable=not config.progress,
    )
    try:
        for iteration in range(start_iteration, config.rl_iterations):
            now = time.monotonic()
            if deadline_all is not None and (now >= deadline_all or now + 1.1 * last_duration > deadline_all):
                stopped = True
                break
            prompts = rl_prompts_for(tasks, config, iteration, lambda t, item: fitting[(t.name, item.uid)])
            if not prompts:
                break
            summary = rl_iteration(
                llm, arbitrator, reference, optimizer, prompts, config, iteration, deadline=deadline_all, log=log
            )
            last_duration = time.monotonic() - now
            if summary is None:
                stopped = True
                log({"phase": "rl_iteration", "iteration": iteration, "cut_by_time_budget": True})
                break
            summary["seconds"] = round(last_duration, 2)
            log(summary)
            echo(
                f"RL iteration {iteration}: {summary['seconds']} s, {summary['rollouts']} rollouts, "
                f"{summary['decisions']} decisions, reward {summary['mean_reward']}, kept {summary['kept_share']}"
            )
            stats.setdefault("rl", []).append({k: v for k, v in summary.items() if k != "prompts"})
            trainer.update(phase="rl", rl_iterations=iteration + 1)
            save(arbitrator, out / "checkpoint", optimizer)
            bar.update(1)
            bar.set_postfix(reward=summary["mean_reward"], kept=summary["kept_share"], refresh=False)
    finally:
        bar.close()
    if deadline_all is not None and time.monotonic() >= deadline_all:
        stopped = True
    stats["elapsed_s"] = round(time.monotonic() - started, 2)
    stats["stopped_by_time_budget"] = stopped
    checkpoint = save(arbitrator, out / "checkpoint", optimizer if trainer.get("phase") == "rl" else None)
    log(
        {
            "phase": "done",
            "elapsed_s": stats["elapsed_s"],
            "stopped_by_time_budget": stopped,
            "rl_iterations": trainer.get("rl_iterations", 0),
        }
    )
    _write_json(out / "summary.json", training_facts())
    echo(f"saved {checkpoint} ({stats['elapsed_s']} s{', stopped by the time budget' if stopped else ''})")
    return TrainResult(out, checkpoint, stats)


__all__ = ["TrainResult", "train_arbitrator"]
