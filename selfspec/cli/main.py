"""`selfspec` command line: generate, models, demo, serve (and the commands installed parts add).

The commands import the engine inside their bodies on purpose: `selfspec --help` and a
mistyped flag answer without loading torch and transformers (seconds on a small machine).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="selfspec: make reasoning models answer sooner without changing what they say.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code=2)


@app.command()
def models(
    cache_dir: Optional[str] = typer.Option(None, help="Model cache directory (default ~/.cache/selfspec)."),
) -> None:
    """List the packaged default models and whether they are installed and converted."""
    from selfspec.models import list_local_models

    table = Table("name", "available", "converted", "description", "source")
    for info in list_local_models(cache_dir=cache_dir):
        table.add_row(
            info.name,
            "yes" if info.available else "no",
            "yes" if info.cached else "no",
            info.description,
            str(info.source or ""),
        )
    console.print(table)


@app.command("save-tokenizer")
def save_tokenizer(
    model: str = typer.Argument(..., help="Packaged name, .gguf file or local HF directory whose tokenizer to save."),
    out_dir: Path = typer.Argument(..., help="Directory to write tokenizer.json and tokenizer_config.json into."),
) -> None:
    """Save a model's checked tokenizer, for `--tokenizer` on a machine whose transformers builds it wrongly.

    Why: transformers 5.17 builds Gemma-3's tokenizer from the GGUF wrongly (see
    `selfspec.models.tokenizer_check`); a tokenizer saved where it is built right loads there fine.
    """
    from selfspec.models import ModelNotFoundError, load_model

    try:
        loaded = load_model(model)
    except (ModelNotFoundError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    out_dir.mkdir(parents=True, exist_ok=True)
    loaded.tokenizer.save_pretrained(str(out_dir))
    console.print(f"saved the tokenizer of {loaded.name} ({len(loaded.tokenizer):,} tokens) to {out_dir}")


GENERATE_SPECULATION = ("auto", "off", "ngram", "suffix", "ssr")
"""`selfspec generate --speculation` values."""


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The user message (wrapped in the model's chat template)."),
    model: str = typer.Option(
        "smollm2", "--model", "-m", help="Packaged name (smollm2, gemma3-270m), a .gguf file, or a local HF directory."
    ),
    max_tokens: int = typer.Option(256, help="Maximum number of generated tokens (thinking + answer)."),
    temperature: float = typer.Option(0.0, help="Sampling temperature; 0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, help="Keep only the k most likely tokens; 0 = off."),
    min_p: float = typer.Option(0.0, help="Drop tokens below min_p x the top probability."),
    seed: Optional[int] = typer.Option(None, help="Per-request random seed for sampling."),
    think: Optional[bool] = typer.Option(
        None,
        "--think/--no-think",
        help="Let the model think first (default: on for native thinking models, off for others).",
    ),
    cot_cap: Optional[int] = typer.Option(None, help="Close thinking by force after this many CoT tokens."),
    answer_cap: Optional[int] = typer.Option(None, help="Stop the answer after this many tokens (continuation cap)."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto (cuda when present, else cpu)."),
    dtype: str = typer.Option("auto", help="float32 | bfloat16 | float16 | auto (bfloat16 on CUDA, float32 on cpu)."),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Tokenizer directory to use instead of the model's own."
    ),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Print tokens as they are generated."),
    ssr: bool = typer.Option(
        False,
        "--ssr/--no-ssr",
        help="Self-speculation: draft the answer from the partial CoT and verify it (implies --think).",
    ),
    draft_budget: list[int] = typer.Option(
        [], help="CoT length(s) at which a draft is forked (repeatable; default 100)."
    ),
    draft_interval: Optional[int] = typer.Option(None, help="Iterative drafting: fork every N CoT tokens."),
    max_draft: int = typer.Option(300, help="Maximum draft length in tokens."),
    reuse: str = typer.Option("prefix+suffix", help="How drafts are used: off | prefix | suffix | prefix+suffix."),
    speculate_thinking: bool = typer.Option(
        False,
        "--speculate-thinking",
        help="With --ssr: also speculate the CoT, the drafts and the answer past the draft over their own context.",
    ),
    thinking_speculator: str = typer.Option(
        "suffix",
        help="With --speculate-thinking: suffix (SuffixDecoding) | ngram (prompt lookup) | longest (the longer of both each step).",
    ),
    gate: str = typer.Option(
        "always",
        help="With --ssr: always (fork at every budget) | cost (only where this device's measured step costs let the draft pay).",
    ),
    suffix_decoding: bool = typer.Option(
        False, "--suffix-decoding", help="Suffix decoding over prompt + output (no SSR)."
    ),
    prompt_lookup: bool = typer.Option(False, "--prompt-lookup", help="n-gram prompt lookup (no SSR)."),
    speculation: str = typer.Option(
        "auto",
        help="auto (SSR with prompt lookup when the model thinks, prompt lookup otherwise, as this machine's "
        "measured costs pay) | off (plain decoding) | ngram | suffix | ssr (with the --ssr settings).",
    ),
) -> None:
    """Generate a reply, streaming tokens to the terminal, then print timings (and speculation figures)."""
    from pydantic import ValidationError

    from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
    from selfspec.llm import LLM
    from selfspec.models import ModelNotFoundError
    from selfspec.server.cli import resolve_device_dtype
    from selfspec.thinking.policy import ThinkingLimits

    spec = None
    if speculation not in GENERATE_SPECULATION:
        _fail(f"--speculation must be one of {', '.join(GENERATE_SPECULATION)}, got {speculation!r}")
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed
        )
        limits = ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap)
        limits.validate()
        if ssr or speculation == "ssr":
            from selfspec.spec.ssr import SSRConfig

            sources = ["draft", "prompt", "output"] if speculate_thinking else ["draft"]
            spec = SSRConfig(
                draft_budgets=list(draft_budget) or [100],
                draft_interval=draft_interval,
                max_draft_len=max_draft,
                reuse=reuse,
                speculate_thinking=speculate_thinking,
                thinking_speculator=thinking_speculator,
                suffix_sources=sources,
                gate=gate,
            )
            think = True
        elif suffix_decoding or prompt_lookup:
            from selfspec.config import PromptLookupConfig, SuffixDecodingConfig

            spec = PromptLookupConfig() if prompt_lookup else SuffixDecodingConfig()
        else:
            from selfspec.config import parse_spec

            spec = parse_spec(speculation)
    except (InvalidSamplingParams, ValueError, ValidationError) as exc:
        _fail(str(exc))
    device, dtype = resolve_device_dtype(device, dtype)
    try:
        llm = LLM(model, device=device, dtype=dtype, tokenizer=tokenizer)
    except (ModelNotFoundError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    try:
        if stream:
            printed = ""
            all_ids: list[int] = []
            seq = llm.submit(prompt, params, spec=spec, limits=limits, thinking=think)
            for ids in llm.iter_tokens(seq):
                all_ids = ids if not all_ids else all_ids + ids
                text = llm.tokenizer.decode(all_ids, skip_special_tokens=True)
                sys.stdout.write(text[len(printed) :])
                sys.stdout.flush()
                printed = text
            sys.stdout.write("\n")
            result = llm.result(seq)
        else:
            (result,) = llm.generate(prompt, params, spec=spec, limits=limits, thinking=think)
            console.print(result.text)
    except ValueError as exc:
        _fail(str(exc))
    t = result.timings
    summary = f"{len(result.token_ids)} tokens in {t.total:.2f}s ({len(result.token_ids) / max(t.total, 1e-9):.1f} tok/s), TTFT {t.ttft or 0:.3f}s, finish: {result.finish_reason} ({result.finish_detail})"
    if result.metrics.get("cot_tokens"):
        summary += f", CoT {result.metrics['cot_tokens']} tokens, answer {result.metrics['answer_tokens']} tokens"
    err.print(f"[dim]{summary}[/]")
    if spec is not None and spec.method != "off":
        keys = (
            "drafts",
            "draft_tokens",
            "accepted_prefix",
            "suffix_accepted_tokens",
            "thinking_verify_steps",
            "accepted_tokens",
            "proposed_tokens",
            "mean_acceptance_length",
        )
        err.print(
            "[dim]"
            + ", ".join(
                f"{k}={result.metrics[k]:.2f}"
                if isinstance(result.metrics.get(k), float)
                else f"{k}={result.metrics.get(k)}"
                for k in keys
                if k in result.metrics
            )
            + "[/]"
        )
        auto = result.metrics.get("auto")
        if auto is not None:
            why = f" ({auto['fallback']})" if auto["fallback"] else ""
            err.print(f"[dim]auto: the {auto['path']} path{why}, proposal lengths {auto['k_chosen']}[/]")
        for verdict in result.metrics.get("draft_gate", []):
            err.print(
                f"[dim]draft gate at CoT token {verdict['cot_tokens']}: {verdict['action']} ({verdict['reason']})[/]"
            )


@app.command()
def demo(
    model: str = typer.Option(
        "smollm2-thinker-v4b",
        "--model",
        "-m",
        help="Model to run the demo on (default: SmolLM2-135M-Instruct + the v4b thinker adapter shipped here).",
    ),
    prompt: Optional[str] = typer.Option(
        None, help="The user message (default: a held-out class-synthesis task of the thinker's generator)."
    ),
    cot_cap: int = typer.Option(1200, min=1, help="CoT cap."),
    answer_cap: int = typer.Option(600, min=1, help="Continuation cap."),
    draft_budget: int = typer.Option(300, min=1, help="CoT length at which the draft is forked."),
) -> None:
    """Run the main job on the default model: the SSR demo when available, else plain generation."""
    try:
        from selfspec.cli.demo import run_demo
    except ImportError:
        run_demo = None
    if run_demo is not None:
        from selfspec.models import ModelNotFoundError, TokenizerDefectError

        try:
            run_demo(
                model=model,
                prompt=prompt,
                console=console,
                cot_cap=cot_cap,
                answer_cap=answer_cap,
                draft_budget=draft_budget,
            )
        except (ModelNotFoundError, TokenizerDefectError) as exc:  # a wrong --model: one line, not a traceback
            _fail(str(exc))
        return
    generate(
        prompt=prompt or "Write is_prime(n) in Python.",
        model=model,
        max_tokens=200,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        seed=None,
        think=None,
        cot_cap=None,
        answer_cap=None,
        device="cpu",
        dtype="float32",
        stream=True,
        ssr=False,
        draft_budget=[],
        draft_interval=None,
        max_draft=300,
        reuse="prefix+suffix",
        speculate_thinking=False,
        gate="always",
        suffix_decoding=False,
        prompt_lookup=False,
    )


def _register_subcommands() -> None:
    """`serve` is part of the product; `bench`, `thinker` and `cospec` come from the separately
    installed parts (selfspec-bench, selfspec-research), which declare themselves under the
    `selfspec.commands` entry-point group: the inference package never imports them."""
    from importlib.metadata import entry_points

    from selfspec.server.cli import serve_command

    app.command("serve")(serve_command)
    for point in sorted(entry_points(group="selfspec.commands"), key=lambda p: p.name):
        try:
            sub_app = point.load()
        except ImportError as exc:  # a part installed without its own extras: say so, keep the CLI
            _broken_plugins[point.name] = str(exc)
            continue
        app.add_typer(sub_app, name=point.name)


_broken_plugins: dict[str, str] = {}
_register_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
