"""`selfspec thinker train`, `selfspec thinker eval` and `selfspec thinker copy-stats`.

The main CLI registers `thinker_app` as `selfspec thinker` through the `selfspec.commands`
entry point; `python -m selfspec_research.thinker.cli train ...` runs the same commands
where the main CLI's extra dependencies are missing (a bare GPU machine).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import torch
import typer

from selfspec import LLM, EngineConfig
from selfspec.cli.command_line import auto_device_and_dtype, explicit_command, fail
from selfspec.models import ModelNotFoundError, TokenizerDefectError, load_model
from selfspec.models.registry import ADAPTER_MANIFEST, adapter_data_version, get_model_entry
from selfspec.run_info import device_name
from selfspec_research.lora_training import LoraSpec
from selfspec_research.thinker.data_versions import DATA_MIXES, DATA_VERSION, DATA_VERSIONS, HELDOUT_SEED, TRAIN_SEED
from selfspec_research.thinker.evaluate import EvalConfig, run_eval
from selfspec_research.thinker.examples import DataSpec
from selfspec_research.thinker.measures import convergence_table, template_control
from selfspec_research.thinker.tasks import families as all_families
from selfspec_research.thinker.train import TrainConfig, adapter_size_bytes, save_adapter, train_thinker

thinker_app = typer.Typer(
    help="Train a small model to think (LoRA on seeded think→answer traces) and measure how its answers converge.",
    no_args_is_help=True,
    add_completion=False,
)


def _families(value: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in all_families()]
    if not names or unknown:
        fail(f"unknown task families {unknown or value!r}; known: {', '.join(all_families())}")
    return names


def _knobs(value: str) -> dict[str, dict[str, Any]]:
    try:
        text = value if value.lstrip().startswith("{") else Path(value).read_text()
        parsed = json.loads(text)
    except (ValueError, OSError) as error:
        fail(f"--knobs must be JSON (or a JSON file) mapping family -> knobs: {error}")
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        fail("--knobs must map each family name to a dict of knobs")
    return parsed


def _data_spec(
    families: str, seed: int, items_per_family: int, knobs: Optional[str], data_version: Optional[str]
) -> Any:
    """The data to train or evaluate on: a built-in data version (`--data-version`, default
    `DATA_VERSION`) with its knobs, or custom `--knobs` under a new `--data-version` name."""
    names = _families(families)
    if knobs is None:
        version = data_version or DATA_VERSION
        if version not in DATA_VERSIONS and version not in DATA_MIXES:
            built_in = ", ".join([*DATA_VERSIONS, *DATA_MIXES])
            fail(f"unknown data version {version!r}; built in: {built_in} (custom data need --knobs)")
        return DataSpec.for_version(version, names, seed, items_per_family)
    if data_version is None:
        fail("custom --knobs need a --data-version name, so the adapter says which data it saw")
    parsed = _knobs(knobs)
    if data_version in DATA_VERSIONS and any(
        dict(parsed.get(name, {})) != dict(DATA_VERSIONS[data_version].get(name, {})) for name in names
    ):
        fail(f"--data-version {data_version} names built-in knobs; give custom --knobs a new name")
    return DataSpec(families=names, seed=seed, items_per_family=items_per_family, knobs=parsed, version=data_version)


_DATA_VERSION_HELP = (
    "Built-in data version: thinker-data-v1 (the default), thinker-data-v2 (record extraction, route "
    "finding and arithmetic search version 2), thinker-data-v3 (v2 with route finding version 3) or "
    "thinker-data-v4 (v3's items with CoTs of varied wording), thinker-data-long-v1 (class answers longer than their CoT) "
    "or the mix thinker-data-mix-v4-long-v1 (training); with --knobs, the name of the custom data."
)


def _command_line(ctx: typer.Context) -> str:
    """This invocation as an explicit `selfspec thinker ...` command (defaults included)."""
    return explicit_command(ctx, "thinker", ctx.info_name or "")


@thinker_app.command()
def train(
    ctx: typer.Context,
    out: Path = typer.Option(
        Path("adapters/smollm2-thinker"),
        help="Adapter directory to write; it loads by its path, and by name once placed under the weights package's adapters/.",
    ),
    base: str = typer.Option("smollm2", help="Base model: packaged name, .gguf file or local HF directory."),
    families: str = typer.Option(",".join(all_families()), help="Comma-separated task families."),
    items_per_family: int = typer.Option(1500, min=1, help="Training items per family."),
    data_seed: int = typer.Option(
        TRAIN_SEED, help="Generator stream of the training split (held-out evals use other seeds)."
    ),
    knobs: Optional[str] = typer.Option(
        None, help="JSON (or JSON file) family -> difficulty knobs; default: the data version's."
    ),
    data_version: Optional[str] = typer.Option(None, help=_DATA_VERSION_HELP),
    seed: int = typer.Option(0, help="Seed of LoRA init and batch order."),
    epochs: float = typer.Option(2.0, min=0.01),
    max_len: int = typer.Option(3072, min=16, help="Drop examples longer than this (tokens)."),
    tokens_per_batch: int = typer.Option(49152, min=16, help="Padded tokens per optimizer step."),
    lr: float = typer.Option(1e-3),
    warmup_ratio: float = typer.Option(0.05, min=0.0, max=1.0),
    min_lr_ratio: float = typer.Option(0.1, min=0.0, max=1.0),
    lora_r: int = typer.Option(16, min=1),
    lora_alpha: int = typer.Option(32, min=1),
    lora_dropout: float = typer.Option(0.0, min=0.0, max=1.0),
    early_answer_share: float = typer.Option(
        0.0,
        min=0.0,
        max=1.0,
        help="Share of examples also trained with the CoT cut at 10-90% and closed, loss on the answer only (what SSR's drafts see).",
    ),
    heldout_items_per_family: int = typer.Option(8, min=0, help="Held-out items per family for the loss before/after."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 (auto: bf16 on CUDA, fp32 on CPU)."),
    save_dtype: str = typer.Option("bfloat16", help="dtype of the saved adapter weights."),
    max_steps: Optional[int] = typer.Option(None, min=1, help="Cap on optimizer steps (the LR schedule ends there)."),
    time_budget_s: Optional[float] = typer.Option(
        None,
        help="Fit the step count to this many seconds (measured throughput); recorded, so --max-steps reproduces it.",
    ),
    description: Optional[str] = typer.Option(None, help="Description in the adapter manifest."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """LoRA-train a thinker on generated traces and write the adapter + TRAINING.md."""
    device, dtype = auto_device_and_dtype(device, dtype)
    data = _data_spec(families, data_seed, items_per_family, knobs, data_version)
    config = TrainConfig(
        base=base,
        data=data,
        heldout_items_per_family=heldout_items_per_family,
        max_len=max_len,
        tokens_per_batch=tokens_per_batch,
        epochs=epochs,
        lr=lr,
        warmup_ratio=warmup_ratio,
        min_lr_ratio=min_lr_ratio,
        lora=LoraSpec(r=lora_r, alpha=lora_alpha, dropout=lora_dropout),
        seed=seed,
        device=device,
        dtype=dtype,
        save_dtype=save_dtype,
        max_steps=max_steps,
        time_budget_s=time_budget_s,
        early_answer_share=early_answer_share,
    )
    command = _command_line(ctx)
    typer.echo(f"$ {command}")
    try:
        peft_model, result = train_thinker(config, progress=progress, log=typer.echo)
    except (ModelNotFoundError, TokenizerDefectError) as error:  # a wrong --base: one line, not a traceback
        fail(str(error))
    target = save_adapter(peft_model, out, config, result, description=description, command=command)
    (target / "TRAINING.md").write_text(training_markdown(config, result, command, adapter_size_bytes(target)))
    typer.echo(f"adapter written to {target} ({adapter_size_bytes(target) / 1e6:.1f} MB) in {result.seconds:.0f}s")


def training_markdown(config: Any, result: Any, command: str, size_bytes: int) -> str:
    """TRAINING.md: enough to reproduce the adapter and judge the run."""
    first = result.loss_log[0] if result.loss_log else None
    last = result.loss_log[-1] if result.loss_log else None
    knob_lines = [
        f"  - `{family}`: `{json.dumps(dict(knobs), sort_keys=True)}`"
        for family, knobs in config.data.describe()["knobs"].items()
    ]
    knob_lines += [  # a mix's further parts: the families they add
        f"  - `{family}` (also): `{json.dumps(dict(knobs), sort_keys=True)}`"
        for extra in config.data.describe().get("also", [])
        for family, knobs in extra.items()
    ]
    lines = [
        "# Training of this adapter",
        "",
        "Command (from the repository root):",
        "",
        "```",
        command,
        "```",
        "",
        f"- base model: `{config.base}`; thinking markers `<think>` … `</think>` ({result.thinking_kind} format)",
        f"- data: `{config.data.version}` — families {', '.join(config.data.families)}; "
        f"{config.data.items_per_family} items per family from generator seed {config.data.seed} "
        f"(held-out loss: {config.heldout_items_per_family} per family from seed {config.heldout_seed}); knobs:",
        *knob_lines,
        f"- examples: {result.examples} kept, dropped over {config.max_len} tokens: {result.dropped or 'none'}",
        f"- LoRA: r={config.lora.r}, alpha={config.lora.alpha}, dropout={config.lora.dropout}, targets `{config.lora.target_modules}` "
        f"(the tied output head is not adapted); weights saved as {config.save_dtype}, {size_bytes / 1e6:.1f} MB on disk",
        f"- optimizer: AdamW, lr {config.lr}, linear warm-up {config.warmup_ratio:.0%} of steps then cosine to "
        f"{config.min_lr_ratio}×lr, weight decay {config.weight_decay}, grad clip {config.grad_clip}",
        f"- batches: length-grouped, right-padded, ≤ {config.tokens_per_batch} padded tokens each; "
        f"{config.epochs} epochs = {result.epochs_plan_steps} steps; planned {result.planned_steps} steps"
        + (
            f" (fitted to a {config.time_budget_s:.0f} s time budget; `--max-steps {result.planned_steps}` reproduces the schedule)"
            if config.time_budget_s
            else ""
        )
        + (f" (capped by --max-steps {config.max_steps})" if config.max_steps else "")
        + f"; run: {result.steps} steps ({result.epochs_done:.2f} epochs)"
        + (" — STOPPED EARLY past the time budget" if result.stopped_early else ""),
        f"- loss on the assistant part only (CoT, close marker, answer, EOS); seed {config.seed} (LoRA init, batch order)",
        f"- precision: base weights {config.dtype}"
        + (f" with {config.dtype} autocast" if config.dtype != "float32" else "")
        + ", LoRA weights float32",
        f"- tokens: {result.target_tokens} target / {result.padded_tokens} padded",
        f"- loss: first logged {first['loss']:.4f} (step {first['step']}), last logged {last['loss']:.4f} (step {last['step']})"
        if first and last
        else "- loss: not logged",
        f"- held-out loss: {result.heldout_loss_before:.4f} before, {result.heldout_loss_after:.4f} after",
        f"- device: {result.device_name}; versions: "
        + ", ".join(f"{name} {version}" for name, version in result.versions.items()),
        f"- time: {result.seconds:.1f} s in all (data {result.data_seconds:.1f} s)",
        "",
        "The per-step loss log is in `loss_log.json`; the full configuration and these facts in `selfspec_adapter.json`.",
        "",
    ]
    return "\n".join(lines)


def _training_facts(model: str) -> dict[str, Any] | None:
    """Training facts of a packaged adapter, from its manifest (None for other models)."""
    entry = get_model_entry(model)
    if entry is None or entry.adapter_dir is None or not (entry.adapter_dir / ADAPTER_MANIFEST).is_file():
        return None
    manifest = json.loads((entry.adapter_dir / ADAPTER_MANIFEST).read_text())
    run = manifest.get("training", {})
    facts = {
        "adapter": f"`{entry.adapter_dir.name}` over `{manifest.get('base')}` (see its TRAINING.md)",
        "command": f"`{manifest.get('command')}`",
        "data version": manifest.get("data_version"),
    }
    if run:
        facts.update(
            {
                "steps": f"{run.get('steps')} of {run.get('planned_steps')} ({run.get('epochs_done', 0):.2f} epochs, {run.get('examples')} examples)",
                "training time": f"{run.get('seconds')} s on {run.get('device_name')}",
                "held-out loss": f"{run.get('heldout_loss_before', float('nan')):.4f} → {run.get('heldout_loss_after', float('nan')):.4f}",
            }
        )
    return facts


@thinker_app.command("eval")
def eval_command(
    ctx: typer.Context,
    model: str = typer.Option(
        "smollm2-thinker", "--model", "-m", help="Packaged name, .gguf file or local HF directory."
    ),
    out_dir: Path = typer.Option(
        Path("thinker-eval"),
        help="Where results.json, report.md and convergence.png go (committed: benchmarks/thinker/).",
    ),
    families: str = typer.Option(",".join(all_families()), help="Comma-separated task families."),
    seed: int = typer.Option(HELDOUT_SEED, help="Held-out generator stream (training used seed 0)."),
    items_per_family: int = typer.Option(40, min=1),
    knobs: Optional[str] = typer.Option(None, help="JSON (or JSON file) family -> knobs; default: the data version's."),
    data_version: Optional[str] = typer.Option(None, help=_DATA_VERSION_HELP),
    cot_cap: int = typer.Option(2500, min=1, help="Close thinking by force after this many CoT tokens."),
    answer_cap: int = typer.Option(1000, min=1, help="Stop the answer after this many tokens."),
    draft_cap: int = typer.Option(768, min=1, help="Longest draft decoded at a fork point."),
    convergence_items_per_family: int = typer.Option(
        20, min=1, help="Self-stopped runs per family to fork drafts from."
    ),
    device: str = typer.Option("auto"),
    dtype: str = typer.Option("auto"),
    num_slots: int = typer.Option(64, min=1, help="Concurrent sequences in the engine."),
    max_len: int = typer.Option(6144, min=64, help="Context length of each engine slot."),
    prefill_chunk: int = typer.Option(2048, min=1),
    max_prefill_tokens: int = typer.Option(16384, min=1, help="Prefill tokens per engine step."),
    from_results: Optional[Path] = typer.Option(
        None, help="Only re-render report.md and convergence.png from this results.json."
    ),
    notes: Optional[Path] = typer.Option(None, help="Markdown file appended to report.md (hand-written analysis)."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Evaluate a thinker on held-out items: accuracy, self-stopping, loops, convergence curve."""
    from selfspec_research.thinker.eval_report import (
        write_outputs,  # slow to import (the bench's records): only eval needs it
    )

    note_text = notes.read_text() if notes is not None else None
    if from_results is not None:
        results = json.loads(from_results.read_text())
        if "template_control" not in results:
            results["template_control"] = _template_control_for(results)
        config = results["config"]
        # The table is a pure function of the stored draft rows: recomputing it gives
        # stored results every column the current table has.
        results["convergence"] = convergence_table(results["draft_records"], config["fork_points"], config["draft_cap"])
        for path in write_outputs(results, out_dir, results.get("training"), note_text):
            typer.echo(f"wrote {path}")
        return
    if data_version is None and knobs is None and adapter_data_version(model) in DATA_VERSIONS:
        data_version = adapter_data_version(model)  # items of the kind the adapter learned
        typer.echo(f"data version {data_version} (the one {model} was trained on; --data-version picks another)")
    data = _data_spec(families, seed, items_per_family, knobs, data_version)
    trained_on = (_training_facts(model) or {}).get("data version")
    if trained_on and trained_on != data.version:
        typer.echo(
            f"note: {model} was trained on {trained_on}; evaluating on {data.version} (pick with --data-version)"
        )
    device, dtype = auto_device_and_dtype(device, dtype)
    config = EvalConfig(
        data=data,
        cot_cap=cot_cap,
        answer_cap=answer_cap,
        draft_cap=draft_cap,
        convergence_items_per_family=convergence_items_per_family,
    )
    started = time.perf_counter()
    engine_config = EngineConfig(
        num_slots=num_slots,
        max_len=max_len,
        prefill_chunk=prefill_chunk,
        max_prefill_tokens_per_step=max_prefill_tokens,
    )
    try:
        llm = LLM(model=model, device=device, dtype=dtype, engine_config=engine_config)
    except (ModelNotFoundError, TokenizerDefectError) as error:
        fail(str(error))
    typer.echo(f"loaded {model} in {time.perf_counter() - started:.1f}s")
    results = run_eval(llm, config, progress=progress, log=typer.echo)
    results["command"] = _command_line(ctx)
    results["device"] = _device_label(device)
    results["engine"] = {"num_slots": num_slots, "max_len": max_len, "dtype": dtype}
    results["training"] = _training_facts(model)
    for path in write_outputs(results, out_dir, results["training"], note_text):
        typer.echo(f"wrote {path}")
    checks = results["checks"]
    typer.echo(json.dumps({"overall": results["overall"], "checks": checks}, indent=1))


@thinker_app.command("copy-stats")
def copy_stats_command(
    data_version: str = typer.Option(
        "thinker-data-v3,thinker-data-v4",
        help="Built-in data versions, comma-separated (one table row per family each).",
    ),
    families: str = typer.Option(",".join(all_families()), help="Comma-separated task families."),
    items: int = typer.Option(50, min=2, help="Items per family (template reuse needs two or more)."),
    seed: int = typer.Option(HELDOUT_SEED, help="Generator stream."),
    ngram: int = typer.Option(8, min=1, help="Length of the shared n-grams."),
    tokenizer: str = typer.Option("words", help="words (whitespace-separated) or smollm2 (the thinker's tokens)."),
) -> None:
    """How much the reference CoTs copy: from their prompt, and from other items' CoTs (markdown table)."""
    from selfspec_research.thinker.copying import copy_stats_table, named_tokenizer

    versions = [version.strip() for version in data_version.split(",") if version.strip()]
    unknown = [version for version in versions if version not in DATA_VERSIONS]
    if not versions or unknown:
        fail(f"unknown data versions {unknown or data_version!r}; built in: {', '.join(DATA_VERSIONS)}")
    try:
        counter, unit = named_tokenizer(tokenizer)
    except ValueError as error:
        fail(str(error))
    typer.echo(copy_stats_table(versions, _families(families), items, seed, ngram, counter, unit))


def _template_control_for(results: dict[str, Any]) -> dict[str, Any]:
    """The unrelated-answer control for results written before it existed: it needs only
    the reference answers (regenerated from the recorded data spec) and the tokenizer."""
    data = results["config"]["data"]
    spec = DataSpec(tuple(data["families"]), data["seed"], data["items_per_family"], data["knobs"], data["version"])
    loaded = load_model(results["model"])
    control = template_control(loaded.tokenizer, loaded.thinking, spec.items())
    control["note"] = "computed after the run by `selfspec thinker eval --from-results` (reference answers only, CPU)"
    return control


def _device_label(device: str) -> str:
    return device_name(torch.device(device))


if __name__ == "__main__":
    thinker_app()
