"""`selfspec` command line: generate, models, demo (and the subcommands other modules add)."""

from __future__ import annotations

import sys
import time
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
def models(cache_dir: Optional[str] = typer.Option(None, help="Model cache directory (default ~/.cache/selfspec).")) -> None:
    """List the packaged default models and whether they are installed and converted."""
    from selfspec.models import list_local_models

    table = Table("name", "available", "converted", "description", "source")
    for info in list_local_models(cache_dir=cache_dir):
        table.add_row(info.name, "yes" if info.available else "no", "yes" if info.cached else "no", info.description, str(info.source or ""))
    console.print(table)


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The user message (wrapped in the model's chat template)."),
    model: str = typer.Option("smollm2", "--model", "-m", help="Packaged name (smollm2, gemma3-270m), a .gguf file, or a local HF directory."),
    max_tokens: int = typer.Option(256, help="Maximum number of generated tokens (thinking + answer)."),
    temperature: float = typer.Option(0.0, help="Sampling temperature; 0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass in (0, 1]."),
    top_k: int = typer.Option(0, help="Keep only the k most likely tokens; 0 = off."),
    min_p: float = typer.Option(0.0, help="Drop tokens below min_p x the top probability."),
    seed: Optional[int] = typer.Option(None, help="Per-request random seed for sampling."),
    think: Optional[bool] = typer.Option(None, "--think/--no-think", help="Let the model think first (default: on for native thinking models, off for others)."),
    cot_cap: Optional[int] = typer.Option(None, help="Close thinking by force after this many CoT tokens."),
    answer_cap: Optional[int] = typer.Option(None, help="Stop the answer after this many tokens (continuation cap)."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16 | float16."),
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Print tokens as they are generated."),
) -> None:
    """Generate a reply, streaming tokens to the terminal, then print timings."""
    from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
    from selfspec.llm import LLM
    from selfspec.models import ModelNotFoundError
    from selfspec.policies.thinking import ThinkingLimits

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
        limits = ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap)
        limits.validate()
    except (InvalidSamplingParams, ValueError) as exc:
        _fail(str(exc))
    try:
        llm = LLM(model, device=device, dtype=dtype)
    except (ModelNotFoundError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    try:
        if stream:
            start = time.perf_counter()
            printed = ""
            all_ids: list[int] = []
            for ids in llm.stream(prompt, params, limits=limits, thinking=think):
                all_ids = ids if not all_ids else all_ids + ids
                text = llm.tokenizer.decode(all_ids, skip_special_tokens=True)
                sys.stdout.write(text[len(printed):])
                sys.stdout.flush()
                printed = text
            sys.stdout.write("\n")
            result = llm.result(llm._last_stream_seq)
        else:
            start = time.perf_counter()
            (result,) = llm.generate(prompt, params, limits=limits, thinking=think)
            console.print(result.text)
    except ValueError as exc:
        _fail(str(exc))
    t = result.timings
    summary = f"{len(result.token_ids)} tokens in {t.total:.2f}s ({len(result.token_ids) / max(t.total, 1e-9):.1f} tok/s), TTFT {t.ttft or 0:.3f}s, finish: {result.finish_reason} ({result.finish_detail})"
    if result.metrics.get("cot_tokens"):
        summary += f", CoT {result.metrics['cot_tokens']} tokens, answer {result.metrics['answer_tokens']} tokens"
    err.print(f"[dim]{summary}[/]")


@app.command()
def demo(
    model: str = typer.Option("smollm2", "--model", "-m", help="Model to run the demo on."),
    prompt: str = typer.Option("Write a Python function is_prime(n) that returns True when n is prime.", help="The user message."),
) -> None:
    """Run the main job on the default model: the SSR demo when available, else plain generation."""
    try:
        from selfspec.ssr.demo import run_demo
    except ImportError:
        run_demo = None
    if run_demo is not None:
        run_demo(model=model, prompt=prompt, console=console)
        return
    generate(prompt=prompt, model=model, max_tokens=200, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
             think=None, cot_cap=None, answer_cap=None, device="cpu", dtype="float32", stream=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
