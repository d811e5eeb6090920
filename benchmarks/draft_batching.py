"""Draft-model speculation (SpS) for a batch of requests: batched vs per-sequence draft steps.

Why: with one draft forward per sequence and draft step, a batch of B requests costs B·k
small draft forwards per target step (CoSpec's RL runs 12 rollouts at once). Proposals of
sequences sharing a draft model are now made together (`spec/draft_model.propose_group`):
k draft forwards per target step for the whole batch. This measures both in one run, on the
same prompts, checks the outputs are identical (greedy), and prints the ratio.

    python benchmarks/draft_batching.py --model smollm2-thinker --draft distilled:smollm2-thinker-l8
"""

from __future__ import annotations

import datetime
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import typer

app = typer.Typer(add_completion=False)


@app.command()
def main(
    model: str = typer.Option("smollm2-thinker", help="Target model name or path."),
    draft: str = typer.Option("distilled:smollm2-thinker-l8", help="Draft: layers:N, distilled:<name>, or a model."),
    task: str = typer.Option("class_synthesis", help="Held-out thinker family the prompts come from."),
    prompts: int = typer.Option(8, min=2, help="Requests in the batch."),
    max_tokens: int = typer.Option(96, min=1, help="Generated tokens per request."),
    k: int = typer.Option(8, min=1, max=64, help="Draft tokens per round."),
    repeats: int = typer.Option(2, min=1, help="Timed runs per variant (interleaved)."),
    device: str = typer.Option("cpu"),
    dtype: str = typer.Option("float32"),
    out: Path = typer.Option(
        Path("/tmp/draft_batching"),
        help="Directory for results.json and report.md (committed run: benchmarks/engine_speed/records/cpu/).",
    ),
) -> None:
    from selfspec.config import DraftModelConfig
    from selfspec.engine.sampling import SamplingParams
    from selfspec.server.cli import load_llm
    from selfspec.thinking.policy import ThinkingPolicy
    from selfspec_research.cospec.eval_tasks import build_task

    llm = load_llm(model, device=device, dtype=dtype, num_slots=prompts, max_len=2048, draft=draft)
    messages = [item.messages for item in build_task(task, prompts, 1000).items]
    params = SamplingParams(max_tokens=max_tokens)
    spec = DraftModelConfig(num_speculative_tokens=k)
    llm.generate(messages[:2], SamplingParams(max_tokens=8), spec=spec)  # warm-up, untimed
    batched_rule = ThinkingPolicy.proposal_group
    variants = {"batched": batched_rule, "per-sequence": lambda self: None}
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    outputs: dict[str, list[list[int]]] = {}
    try:
        for _ in range(repeats):
            for name, rule in variants.items():
                ThinkingPolicy.proposal_group = rule
                before = llm.draft_runner.forwards
                start = time.perf_counter()
                results = llm.generate(messages, params, spec=spec)
                seconds = time.perf_counter() - start
                runs[name].append(
                    {
                        "seconds": round(seconds, 3),
                        "draft_forwards": llm.draft_runner.forwards - before,
                        "tokens": sum(len(r.token_ids) for r in results),
                        "accepted": sum(r.metrics["accepted_tokens"] for r in results),
                    }
                )
                outputs[name] = [r.token_ids for r in results]
                typer.echo(f"{name}: {runs[name][-1]}")
    finally:
        ThinkingPolicy.proposal_group = batched_rule
    mean = {name: sum(r["seconds"] for r in rs) / len(rs) for name, rs in runs.items()}
    summary = {
        "model": model,
        "draft": draft,
        "task": task,
        "prompts": prompts,
        "max_tokens": max_tokens,
        "k": k,
        "device": device if device != "cuda" else torch.cuda.get_device_name(),
        "dtype": dtype,
        "date": datetime.date.today().isoformat(),
        "command": "python " + shlex.join(sys.argv),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "runs": runs,
        "mean_seconds": mean,
        "speedup_batched": round(mean["per-sequence"] / mean["batched"], 3),
        "same_outputs": outputs["batched"] == outputs["per-sequence"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    rows = "\n".join(
        f"| {name} | {mean[name]:.2f} | {runs[name][0]['draft_forwards']} | {runs[name][0]['accepted']} / {runs[name][0]['tokens']} |"
        for name in runs
    )
    (out / "report.md").write_text(
        f"# SpS with a batch of {prompts} requests: batched vs per-sequence draft steps\n\n"
        f"`{model}` + draft `{draft}`, K = {k}, {max_tokens} tokens per request, {task} prompts, "
        f"{summary['device']} {dtype}, {repeats} interleaved runs each, {summary['date']}.\n\n"
        f"Command: `{summary['command']}`\n\n"
        "| draft steps | mean seconds | draft forwards | accepted / output tokens |\n|---|---|---|---|\n"
        f"{rows}\n\nBatched is **{summary['speedup_batched']:.2f}x** faster end to end; outputs identical: "
        f"{summary['same_outputs']}.\n"
    )
    typer.echo(f"batched {summary['speedup_batched']}x, same outputs {summary['same_outputs']} -> {out}")


if __name__ == "__main__":
    app()
