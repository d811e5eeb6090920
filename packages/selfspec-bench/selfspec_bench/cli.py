"""`selfspec bench`: run modes side by side on a benchmark; `selfspec bench report`: tables + plots.

The `selfspec` command finds `bench_app` through the `selfspec.commands` entry point, so the
harness is installed (or left out) as a part of its own: the inference package has no import of it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console

from selfspec_bench.context_fit import fit_to_context
from selfspec_bench.datasets import load_benchmark
from selfspec_bench.modes import ALL_MODES, PAPER_ANSWER_CAPS, BenchSettings
from selfspec_bench.runner import ResumeMismatchError, check_settings, mismatches, record_skipped, run_bench
from selfspec_bench.timing_cli import app as timing_app

bench_app = typer.Typer(
    help="Latency of every mode against the plain baseline, side by side, on real benchmarks.",
    invoke_without_command=True,
    no_args_is_help=False,
)
bench_app.registered_commands += timing_app.registered_commands  # replay, price, step-grid
console = Console(stderr=True)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    benchmark: str = typer.Option(
        "humaneval",
        "--benchmark",
        "-b",
        help="humaneval | classeval | longproc | longproc/<task> | gsm8k | mbpp | math500 | thinker/<family> (held-out thinker tasks).",
    ),
    model: str = typer.Option("smollm2", "--model", "-m", help="Model name, .gguf file or HF directory."),
    modes: str = typer.Option(
        "baseline,prefix,suffix,prefix+suffix", help=f"Comma-separated modes: {', '.join(ALL_MODES)}."
    ),
    limit: Optional[int] = typer.Option(None, min=1, help="Number of samples (default: all)."),
    offset: int = typer.Option(0, min=0, help="Skip this many samples first."),
    ids: Optional[str] = typer.Option(
        None,
        "--ids",
        help="Comma-separated sample ids to run (e.g. HumanEval/42,HumanEval/104), in the dataset's order; replaces --offset/--limit. Reruns the samples a diagnostic needs in one process.",
    ),
    path: Optional[str] = typer.Option(None, help="Dataset file (or LongProc data dir) of the upstream format."),
    cot_cap: int = typer.Option(2000, min=1, help="CoT cap: thinking is closed by force at this many tokens."),
    answer_cap: Optional[int] = typer.Option(
        None, min=1, help="Continuation cap (default: paper row, 1500 HumanEval / 4000 ClassEval / 2000 LongProc)."
    ),
    draft_budget: str = typer.Option(
        "500",
        help="CoT length at which the draft is forked. Comma-separated (e.g. 50,100,200,400) for a sweep: one run per budget on one loaded engine, each with its own baseline, so that the report plots speedup against draft budget.",
    ),
    draft_interval: Optional[int] = typer.Option(
        None, min=1, help="Iterative mode: fork every N CoT tokens (default: the draft budget)."
    ),
    converge_tokens: Optional[int] = typer.Option(
        None,
        min=1,
        help="Mode iterative-converge: stop forking once two drafts agree on this many first tokens (default 32).",
    ),
    max_draft: int = typer.Option(500, min=1, help="Maximum draft length (tokens)."),
    natural: bool = typer.Option(
        False,
        "--natural/--fixed",
        help="Natural lengths (EOS and the model's end of thinking honoured) instead of the paper's fixed lengths.",
    ),
    suffix_depth: int = typer.Option(4, help="Suffix tree depth (caps match + proposal)."),
    suffix_spec_tokens: int = typer.Option(16, help="Max tokens a suffix proposal may hold."),
    suffix_factor: float = typer.Option(4.0, help="Suffix budget factor (tokens per matched token)."),
    suffix_sources: str = typer.Option("draft", help="Suffix sources for SSR modes: draft[,prompt,output,global]."),
    suffix_backoff: int = typer.Option(
        16,
        min=0,
        help="SSR modes: after a failed suffix proposal skip 1, 2, 4, ... up to N answer steps (0: never skip).",
    ),
    backend: str = typer.Option(
        "selfspec",
        "--backend",
        help="selfspec (this package's engine) | vllm (the pinned vLLM, `make install-vllm`; --model is a local HF directory; modes baseline,prefix,suffix,prefix+suffix,iterative).",
    ),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16."),
    tokenizer: Optional[str] = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer directory to use instead of the model's own (e.g. one saved where transformers builds a GGUF's tokenizer correctly).",
    ),
    token_buckets: Optional[str] = typer.Option(
        None,
        "--token-buckets",
        help="Static forwards' tokens-per-row buckets, comma-separated (GPU default 1,2,4,8,16,32,64; given, a CPU engine buckets too). In bf16 kernels of different shapes round differently: e.g. 16,64 puts decode and every verify of <= 16 tokens in one shape.",
    ),
    max_len: Optional[int] = typer.Option(
        None,
        "--max-len",
        min=1,
        help="Engine context (KV positions per slot); default: what the longest runnable sample needs. Larger values keep every run's cache shape fixed across sample slices.",
    ),
    num_slots: int = typer.Option(
        4, min=1, help="KV slots (a request and its drafts need 2+; raised to 3 x --concurrency)."
    ),
    concurrency: int = typer.Option(
        1,
        min=1,
        help="Samples whose requests of a mode share the engine's batch (per-request latency); 1 = one at a time.",
    ),
    max_step_tokens: Optional[int] = typer.Option(
        None, min=1, help="At most this many tokens fed per forward across the batch; proposals shrink to fit."
    ),
    draft: Optional[str] = typer.Option(
        None, help="Draft model for the sps mode: layers:N (the target's first N layers) or a model name/path."
    ),
    out: str = typer.Option("runs/bench.jsonl", help="JSONL file the records are appended to."),
    resume: bool = typer.Option(True, "--resume/--fresh", help="Skip (sample, mode) pairs already in --out."),
    check_exact: bool = typer.Option(
        True, "--check-exact/--no-check-exact", help="Compare each mode's tokens with the baseline's; list mismatches."
    ),
    score: bool = typer.Option(
        False, "--score/--no-score", help="Grade answers with the benchmark's checker (subprocess)."
    ),
    seed: int = typer.Option(0, help="Sampling seed (greedy runs ignore it)."),
    group_warm_up: bool = typer.Option(
        True,
        "--group-warm-up/--no-group-warm-up",
        help="Short untimed runs of every sample before its timed ones, so that the first timed run (whichever mode has that place) does not pay for a new prompt shape or an idle GPU.",
    ),
    run_name: Optional[str] = typer.Option(
        None,
        "--run-name",
        help="Name a run that must stay apart from others of the same settings (e.g. an ablation re-running the baseline beside modes a committed run lacks): its records resume, pair and get a report table only with records of the same name.",
    ),
    data_version: Optional[str] = typer.Option(
        None,
        help="thinker/<family> benchmarks: the generators' data version (default: the one the model's adapter was trained on, else thinker-data-v1).",
    ),
    step_cost_prior: Optional[str] = typer.Option(
        None,
        "--step-cost-prior",
        help="Decide as the device a step-cost model (`selfspec bench step-grid`) was measured on: the engine's step costs are that model's, frozen, on the bucketed static path (what-if runs for `selfspec bench price`; timings stay this machine's).",
    ),
    record_schedule: bool = typer.Option(
        True,
        "--record-schedule/--no-record-schedule",
        help="Keep each run's forward schedule in its record (`schedule`, a few hundred bytes to a few KB) for `selfspec bench replay` at another model size; a batched run (`--concurrency`) keeps its batch's one schedule on the batch's first record (`batch_schedule`, for the report's device and host table; not replayed).",
    ),
) -> None:
    """Run the modes on the benchmark (interleaved per sample) and append JSONL records."""
    if ctx.invoked_subcommand is not None:
        return
    from selfspec.engine.config import EngineConfig
    from selfspec.engine.fusion import inductor_modes
    from selfspec.engine.static_forward import GraphBuckets
    from selfspec.llm import LLM
    from selfspec.run_info import device_name, library_versions
    from selfspec.spec.suffix import SuffixOptions

    try:
        buckets = (
            GraphBuckets(tokens=tuple(int(x) for x in token_buckets.split(","))) if token_buckets else GraphBuckets()
        )
    except ValueError as err:
        console.print(f"[red]error:[/] --token-buckets {token_buckets!r}: {err}")
        raise typer.Exit(2)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in mode_list if m not in ALL_MODES]
    if unknown:
        console.print(f"[red]error:[/] unknown mode(s) {unknown}; choose from {', '.join(ALL_MODES)}")
        raise typer.Exit(2)
    budgets = _parse_budgets(draft_budget)
    family = benchmark.split("/")[0]
    cap = answer_cap or PAPER_ANSWER_CAPS.get(family, 1500)
    try:
        settings = _checked_settings(
            budgets,
            mode_list,
            cot_cap=cot_cap,
            answer_cap=cap,
            draft_interval=draft_interval,
            converge_tokens=converge_tokens,
            max_draft_len=max_draft,
            fixed_length=not natural,
            suffix=SuffixOptions(max_depth=suffix_depth, max_spec_tokens=suffix_spec_tokens, spec_factor=suffix_factor),
            suffix_sources=[s.strip() for s in suffix_sources.split(",") if s.strip()],
            suffix_backoff_max=suffix_backoff,
            seed=seed,
            concurrency=concurrency,
            max_step_tokens=max_step_tokens,
            run_name=run_name.strip() if run_name and run_name.strip() else None,
        )
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        console.print(f"[red]error:[/] invalid bench settings: {_settings_problem(err)}")
        raise typer.Exit(2) from None
    if benchmark.startswith("thinker/") and data_version is None and path is None:
        from selfspec.models.registry import adapter_data_version

        data_version = adapter_data_version(model)  # the items the adapter was trained on (None: the default)
    extra = {"data_version": data_version} if benchmark.startswith("thinker/") and data_version else {}
    if ids is not None:
        wanted = [i.strip() for i in ids.split(",") if i.strip()]
        everything = _load_samples(benchmark, path, extra)
        known = {s.id for s in everything}
        missing = [i for i in wanted if i not in known]
        if missing or not wanted:
            console.print(
                f"[red]error:[/] --ids: {', '.join(missing) or 'no ids given'} not in {benchmark} "
                f"(ids look like {everything[0].id if everything else '?'})"
            )
            raise typer.Exit(2)
        samples = [s for s in everything if s.id in set(wanted)]
    else:
        samples = _load_samples(benchmark, path, {**extra, "limit": limit, "offset": offset})
        if not samples:
            console.print(
                f"[red]error:[/] --offset {offset}{f' --limit {limit}' if limit else ''} selects no sample of {benchmark}"
            )
            raise typer.Exit(2)
    if backend == "vllm":
        _run_on_vllm(ctx, model, samples, mode_list, settings, budgets, Path(out), dtype)
        return
    if backend != "selfspec":
        console.print(f"[red]error:[/] --backend {backend!r}: choose selfspec or vllm")
        raise typer.Exit(2)
    if "sps" in mode_list and draft is None:
        console.print("[red]error:[/] the sps mode needs --draft (e.g. --draft layers:8)")
        raise typer.Exit(2)
    num_slots = max(num_slots, 3 * concurrency)
    from selfspec.engine.sizing import model_context_length
    from selfspec.models import load_model
    from selfspec.models.tokenizer_check import tokenizer_summary

    try:
        loaded = load_model(model, device=device, dtype=dtype, tokenizer=tokenizer)
    except ValueError as exc:  # ModelNotFoundError and TokenizerDefectError are ValueErrors
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    # The engine gets the room the longest sample needs; samples that cannot fit the model's
    # context at these budgets are skipped and recorded (`context_fit`).
    fit = fit_to_context(
        samples, loaded.tokenizer, loaded.thinking, model_context_length(loaded.model.config), cot_cap, cap
    )
    if fit.skipped:
        console.print(
            f"[yellow]{len(fit.skipped)} of {len(samples)} samples skipped:[/] prompt + CoT cap ({cot_cap}) + answer cap "
            f"({cap}) exceed {loaded.name}'s context of {fit.context} tokens "
            f"({', '.join(s['sample_id'] for s in fit.skipped[:5])}{', …' if len(fit.skipped) > 5 else ''})"
        )
    samples = fit.runnable
    if max_len is not None and max_len < fit.max_len:
        console.print(
            f"[red]error:[/] --max-len {max_len} is shorter than the {fit.max_len} positions the longest sample needs"
        )
        raise typer.Exit(2)
    if max_len is not None and max_len > fit.context:
        console.print(f"[red]error:[/] --max-len {max_len} exceeds {loaded.name}'s context of {fit.context} tokens")
        raise typer.Exit(2)
    # --token-buckets also puts a CPU engine on the bucketed static path (a GPU takes it with its graphs).
    engine_config = EngineConfig(
        num_slots=num_slots,
        max_len=max_len or fit.max_len,
        clamp_max_len=True,
        graph_buckets=buckets,
        static_shapes=token_buckets is not None or step_cost_prior is not None,
        max_step_tokens=max_step_tokens,
    )
    llm = LLM.from_loaded(loaded, engine_config=engine_config, draft=draft)
    decided_as = _install_prior(llm, step_cost_prior) if step_cost_prior else None
    meta = {
        "device": device if device == "cpu" else device_name(device),
        "dtype": dtype,
        "date": time.strftime("%Y-%m-%d"),
        "versions": library_versions(),
        "tokenizer": str(Path(tokenizer).expanduser().resolve())
        if tokenizer
        else "model",  # where prompts were tokenized
        "tokenizer_summary": tokenizer_summary(loaded.tokenizer),  # and what it makes of plain English
        "engine_max_len": llm.engine.max_len,  # the KV cache shape; bf16 exactness rates are compared per shape
        "inductor": inductor_modes(),  # deterministic / batch-invariant compiled kernels
        "token_buckets": list(buckets.tokens),  # static forwards' token buckets (a bf16 rounding factor)
        **({"decided_as": decided_as} if decided_as else {}),
    }
    console.print(
        f"{len(samples)} samples x {len(mode_list)} modes -> {out}"
        + (f" (draft budgets {', '.join(map(str, budgets))}: one run each)" if len(budgets) > 1 else "")
    )
    for index, budget in enumerate(budgets):
        run_settings = dataclasses.replace(settings, draft_budget=budget)
        # Each run's records carry the command that reproduces that run alone.
        run_meta = {**meta, "command": _command_line({**ctx.params, "draft_budget": str(budget)})}
        fresh = not resume and index == 0  # --fresh clears the file once, not each budget's records
        if not samples and fresh and Path(out).exists():
            Path(out).unlink()  # --fresh with nothing to run: only this run's skip records remain
        try:
            records = (
                run_bench(
                    llm,
                    samples,
                    mode_list,
                    run_settings,
                    Path(out),
                    resume=not fresh,
                    score=score,
                    meta=run_meta,
                    warm_each_group=group_warm_up,
                    co_tenant_probe=co_tenant_probe(device),
                    record_schedule=record_schedule,
                )
                if samples
                else []
            )
        except ResumeMismatchError as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from None
        record_skipped(
            Path(out), fit.skipped, llm.model_name, run_settings, run_meta
        )  # after run_bench: --fresh clears the file
        if check_exact:
            _print_exactness(mismatches(records), budget if len(budgets) > 1 else None)


def _install_prior(llm, path: str) -> str:
    """Freeze the engine's step costs to a step-cost model's: the policies decide as on its device."""
    from selfspec.engine.cost_model import StepCostModel
    from selfspec.engine.step_costs import StepCosts

    try:
        prior = StepCostModel.load(Path(path))
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] --step-cost-prior {path}: {exc}")
        raise typer.Exit(2) from None
    llm.engine.step_costs = StepCosts(llm.engine.runner.static.buckets.tokens, prior=prior, frozen=True)
    return f"{prior.shape} on {prior.device} ({prior.dtype})"


def _run_on_vllm(ctx, model, samples, modes, settings, budgets, out: Path, dtype: str) -> None:
    """`--backend vllm`: one run per budget on two engines of the same vLLM (see vllm_backend)."""
    import json

    import torch

    from selfspec.integrations.vllm.compat import VLLMUnsupportedError
    from selfspec.run_info import device_name, library_versions
    from selfspec_bench.vllm_backend import run_vllm_bench, summarize

    # vLLM picks its platform itself (--device does not reach it): record the one it runs on.
    device = device_name("cuda") if torch.cuda.is_available() else "cpu"
    meta = {"device": device, "dtype": dtype, "date": time.strftime("%Y-%m-%d"), "versions": library_versions()}
    for budget in budgets:
        run_settings = dataclasses.replace(settings, draft_budget=budget)
        run_meta = {**meta, "command": _command_line({**ctx.params, "draft_budget": str(budget)})}
        try:
            records = run_vllm_bench(
                model, samples, modes, run_settings, out, meta=run_meta, engine_args={"dtype": dtype}
            )
        except (ValueError, VLLMUnsupportedError) as err:
            console.print(f"[red]error:[/] {err}")
            raise typer.Exit(2) from None
        summary = {"draft_budget": budget, "modes": summarize(records), **run_meta}
        out.with_suffix(f".b{budget}.summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        console.print_json(json.dumps(summary["modes"]))


def _checked_settings(budgets: list[int], modes: list[str], **knobs: Any) -> BenchSettings:
    """The run's settings, with every mode's spec built once per budget (`check_settings`), so
    that a bad knob stops the command here rather than after the first sample's baseline ran."""
    settings = BenchSettings(draft_budget=budgets[0], **knobs)
    for budget in budgets:
        check_settings(modes, dataclasses.replace(settings, draft_budget=budget))
    return settings


# The options behind SuffixOptions' fields, so that an error names what the user typed.
_SUFFIX_FLAGS = {
    "max_depth": "--suffix-depth",
    "max_spec_tokens": "--suffix-spec-tokens",
    "spec_factor": "--suffix-factor",
}


def _settings_problem(err: ValueError) -> str:
    """One line per bad knob for pydantic's errors (`--suffix-depth: ...`), else the message."""
    errors = getattr(err, "errors", None)
    if not callable(errors):
        return str(err)
    parts = []
    for e in errors():
        field = ".".join(map(str, e.get("loc", ()))) or "value"
        parts.append(f"{_SUFFIX_FLAGS.get(field, field)}: {e.get('msg')} (got {e.get('input')!r})")
    return "; ".join(parts)


def _load_samples(benchmark: str, path: str | None, opts: dict[str, Any]) -> list[Any]:
    """The benchmark's samples, or a clear error (exit 2) for an unknown benchmark or a data file
    that is missing or not of the upstream format: a user's own file should not end in a traceback."""
    try:
        return load_benchmark(benchmark, path=path, **opts)
    except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        where = f" ({path})" if path else ""
        kind = "" if isinstance(err, (OSError, ValueError)) else f"{type(err).__name__} "
        console.print(f"[red]error:[/] benchmark {benchmark}{where}: {kind}{err}")
        raise typer.Exit(2) from None


def _parse_budgets(text: str) -> list[int]:
    """`--draft-budget`: one positive integer, or several comma-separated (a sweep), in the order given."""
    try:
        budgets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        budgets = []
    if not budgets or any(b < 1 for b in budgets) or len(set(budgets)) != len(budgets):
        console.print(
            f"[red]error:[/] --draft-budget {text!r}: give a positive integer, or distinct ones separated by commas"
        )
        raise typer.Exit(2)
    return budgets


def _print_exactness(bad: list[tuple[str, str]], budget: int | None) -> None:
    where = f" (draft budget {budget})" if budget is not None else ""
    if bad:
        console.print(f"[red]{len(bad)} outputs differ from the baseline{where}:[/]")
        for sid, mode in bad:
            console.print(f"  {sid}  {mode}")
    else:
        console.print(f"[green]every mode matched the baseline token for token{where}[/]")


@bench_app.command()
def report(
    inputs: list[str] = typer.Argument(..., help="JSONL files written by `selfspec bench`."),
    out_dir: str = typer.Option(
        "selfspec-report", help="Where report.md and the PNG plots go (committed reports: benchmarks/<topic>/)."
    ),
) -> None:
    """Markdown tables per model x benchmark and PNG plots from bench records."""
    # Imported here, not at the top: report pulls in matplotlib and scipy (~2 s) that `selfspec bench` need not pay.
    from selfspec_bench.report import ReportError, build_report

    try:
        path = build_report([Path(p) for p in inputs], Path(out_dir))
    except ReportError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2)
    console.print(f"report written to {path}")
    print(Path(path).read_text())


def co_tenant_probe(device: str) -> Callable[[], Optional[int]] | None:
    """On a GPU, what asks how many other processes share it (recorded per sample as
    `gpu_co_tenants`); nothing on a CPU, where the bench's timings assume a quiet machine anyway."""
    if not str(device).startswith("cuda"):
        return None
    from selfspec.run_info import gpu_co_tenants

    return lambda: gpu_co_tenants(device)


def _command_line(params: dict) -> str:
    """The run's command rebuilt from the parsed options (so it is right under any caller)."""
    parts = ["selfspec", "bench"]
    for name, value in params.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            parts += [flag, str(value)]
    return " ".join(parts)
