"""`selfspec cospec complementarity`: the target and its draft, each alone, batched, scored.

Thin: parses options, loads the target with its draft, hands over to
`complementarity.run_complementarity`, writes results.json and report.md.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Optional

import typer

from selfspec.cli.command_line import auto_device_and_dtype, explicit_command, fail
from selfspec.run_info import library_versions
from selfspec_research.cospec.complementarity import ComplementarityConfig, report_markdown, run_complementarity
from selfspec_research.cospec.eval_config import DEFAULT_DRAFT
from selfspec_research.cospec.eval_tasks import parse_tasks
from selfspec_research.thinker.data_versions import HELDOUT_SEED
from selfspec_research.thinker.tasks import families as all_families


def complementarity_command(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-thinker-v4b", "--model", "-m", help="Target model (or 'tiny')."),
    draft: str = typer.Option(DEFAULT_DRAFT, "--draft", help="Draft: layers:N, distilled:DIR or a model name."),
    tasks: str = typer.Option(",".join(all_families()), "--tasks", help="Comma list of thinker families / gsm8k."),
    n: int = typer.Option(24, "--n", min=1, help="Held-out items per task."),
    data_version: Optional[str] = typer.Option(None, "--data-version", help="Knobs of the thinker families' items."),
    seed: int = typer.Option(HELDOUT_SEED, "--seed", help="Held-out stream (training's seed 0 is refused)."),
    max_tokens: int = typer.Option(3072, "--max-tokens", min=1, help="Generated tokens per item."),
    num_slots: int = typer.Option(32, "--num-slots", min=1, help="Sequences decoded together, per model."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Context per slot (default: the model's, ≤ 4096)."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 | float16 | auto (bf16 on CUDA)."),
    out: Path = typer.Option(Path("cospec-complementarity"), "--out", help="Directory for results.json, report.md."),
) -> None:
    """Which held-out items the target and its draft solve, each alone (CoSpec's room: draft-but-not-target)."""
    try:
        config = ComplementarityConfig(
            tasks=parse_tasks(tasks),
            n=n,
            seed=seed,
            data_version=data_version,
            max_tokens=max_tokens,
            draft_slots=num_slots,
        )
    except ValueError as exc:
        fail(str(exc))
    device, dtype = auto_device_and_dtype(device, dtype)
    from selfspec.server.cli import load_llm

    try:
        llm = load_llm(model, device=device, dtype=dtype, num_slots=num_slots, max_len=max_len, draft=draft)
    except (ValueError, FileNotFoundError, OSError) as exc:
        fail(f"could not load {model!r} with draft {draft!r}: {exc}")
    try:
        result = run_complementarity(llm, config, log=lambda message: typer.echo(message, err=True))
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    meta = {
        "model": getattr(llm, "model_name", model),
        "draft": draft,
        "device": device,
        "dtype": dtype,
        "command": explicit_command(ctx, "cospec", "complementarity"),
        "date": datetime.date.today().isoformat(),
        "versions": library_versions(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, **result}, indent=1) + "\n")
    (out / "report.md").write_text(report_markdown(result, meta))
    for row in result["rows"]:
        typer.echo(
            f"{row['task']:>18} target {row['target_solved']}/{row['items']} draft {row['draft_solved']} "
            f"draft-not-target {row['draft_not_target']} union {row['union']}"
        )


def register(app: typer.Typer) -> None:
    """Add `complementarity` to `app` (the `cospec` group)."""
    app.command("complementarity")(complementarity_command)


__all__ = ["complementarity_command", "register"]
