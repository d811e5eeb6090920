"""`selfspec demo`: SSR and auto (the default speculation) against the plain baseline on one prompt.

Shows what a user cares about: the answer (identical in both runs), both latencies, the time
to the first answer token, how much of the answer came from the draft (accepted prefix,
suffix-accepted tokens, answer tokens per forward), what the draft gate decided from this
machine's measured step costs, what auto chose on this machine (its path and proposal lengths,
with its own ratio and first-answer-token time), and what the same comparison gave on an H200.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.spec.auto import AutoConfig
from selfspec.spec.ssr import SSRConfig
from selfspec.thinking.policy import ThinkingLimits

DEMO_MODEL = "smollm2-thinker-v4b"
"""The thinker trained with early-answer examples on thinker-data-v3: its drafts from a partial
CoT agree with the final answer (92.5% of the answer predictable at half the CoT,
benchmarks/thinker/README.md), which is the situation SSR is built for."""


DEMO_PROMPT_FILE = Path(__file__).with_name("demo_prompt.txt")
"""A held-out class-synthesis task of the thinker's generator (held-out seed 1000, item 3; the
class-synthesis knobs are the same in every thinker data version). Shipped as text so the
demo needs no research code; a test of the research part checks it against the generator."""


DEMO_REFERENCE_FILE = Path(__file__).with_name("demo_reference.json")
"""The committed H200 figures of the demo's model on its task family, summarised from the
benchmark records by benchmarks/thinker/demo_reference.py (a test keeps the two equal)."""


def demo_reference() -> dict | None:
    """The H200 summary shipped with the package, None if it is missing (a trimmed install)."""
    try:
        return json.loads(DEMO_REFERENCE_FILE.read_text())
    except FileNotFoundError:
        return None


def default_demo_prompt() -> str:
    """The demo's prompt: a task of the kind the packaged thinker was trained on, never seen in training."""
    return DEMO_PROMPT_FILE.read_text()


def run_demo(
    *,
    model: str = DEMO_MODEL,
    prompt: str | None = None,
    console: Console,
    cot_cap: int = 1200,
    answer_cap: int = 600,
    draft_budget: int = 300,
    device: str = "cpu",
    dtype: str = "float32",
) -> None:
    prompt = prompt or default_demo_prompt()
    console.print(
        f"[bold]selfspec demo[/]  model={model}  CoT cap {cot_cap}, draft at {draft_budget}, answer cap {answer_cap}"
    )
    llm = LLM(model, device=device, dtype=dtype, engine_config=EngineConfig(num_slots=4, max_len=4096))
    fmt = llm.thinking_format
    console.print(f"thinking format: {fmt.kind} ({fmt.start_marker} ... {fmt.end_marker})")
    params = SamplingParams(max_tokens=cot_cap + answer_cap + 32)
    limits = ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap)  # natural lengths: EOS and </think> honoured
    # The cost gate: on a machine where the draft's extra row costs more than the draft can save,
    # SSR drafts nothing (or cancels the draft once measured) instead of making the request slower.
    spec = SSRConfig(draft_budgets=[draft_budget], max_draft_len=answer_cap, gate="cost")
    # Warm-up so first-call costs do not land on either side.
    llm.generate(prompt, SamplingParams(max_tokens=8), thinking=True, spec="off")
    with console.status("baseline (plain greedy)..."):
        (base,) = llm.generate(
            prompt, params, limits=ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap), thinking=True, spec="off"
        )
    with console.status("SSR (draft from the partial CoT, verify, suffix-decode)..."):
        (ssr,) = llm.generate(prompt, params, limits=limits, spec=spec, thinking=True)
    with console.status("auto (the default speculation: its choices from this machine's measured costs)..."):
        (auto,) = llm.generate(
            prompt,
            params,
            limits=ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap),
            spec=AutoConfig(),
            thinking=True,
        )

    console.print(Panel(_clip(prompt, 12), title="prompt", border_style="dim"))
    console.print(
        Panel(_clip(base.reasoning_text or "", 12), title="reasoning (baseline, clipped)", border_style="dim")
    )
    console.print(Panel(ssr.answer_text or ssr.text, title="answer (SSR)", border_style="green"))
    same = base.token_ids == ssr.token_ids
    table = Table("", "baseline", "SSR")
    table.add_row("total latency", f"{base.timings.total:.2f} s", f"{ssr.timings.total:.2f} s")
    table.add_row("time to first answer token", _s(base.timings.first_answer_token), _s(ssr.timings.first_answer_token))
    table.add_row("answer phase", _s(base.timings.answer), _s(ssr.timings.answer))
    table.add_row(
        "finish", f"{base.finish_reason} ({base.finish_detail})", f"{ssr.finish_reason} ({ssr.finish_detail})"
    )
    table.add_row(
        "CoT / answer tokens",
        f"{base.metrics['cot_tokens']} / {base.metrics['answer_tokens']}",
        f"{ssr.metrics['cot_tokens']} / {ssr.metrics['answer_tokens']}",
    )
    m = ssr.metrics
    table.add_row("drafts (tokens)", "-", f"{m.get('drafts', 0)} ({m.get('draft_tokens', 0)})")
    table.add_row("accepted prefix", "-", str(m.get("accepted_prefix", 0)))
    table.add_row("suffix-accepted tokens", "-", str(m.get("suffix_accepted_tokens", 0)))
    table.add_row("answer tokens per forward", "1.00", f"{m.get('mean_acceptance_length', 0):.2f}")
    console.print(table)
    ratio = ssr.timings.total / base.timings.total
    console.print(f"draft gate: {_gate_line(m.get('draft_gate'))}")
    first = _first_answer_line(base.timings.first_answer_token, ssr.timings.first_answer_token)
    console.print(
        f"identical output: [bold]{'yes' if same else 'NO'}[/]   latency ratio SSR/baseline: [bold]{ratio:.3f}[/]"
        f" (SSR {abs(1 - ratio):.1%} {'faster' if ratio <= 1 else 'slower'}){first}   (this machine, {device} {dtype})"
    )
    console.print(_auto_line(base, auto))
    reference = demo_reference()
    if reference is not None:
        console.print(_reference_line(reference))


def _gate_line(verdicts: list[dict] | None) -> str:
    """The gate's last word, with the measured figures it used."""
    if not verdicts:
        return "no budget reached (thinking ended first)"
    last = verdicts[-1]
    said = {"fork": "drafted", "probe": "drafted (costs not yet measured)", "keep": "kept the draft"}
    said |= {"skip": "did not draft", "cancel": "cancelled the draft"}
    return f"{said.get(last['action'], last['action'])} at CoT token {last['cot_tokens']}: {last['reason']}"


def _auto_line(base, auto) -> str:
    """Auto beside the baseline: identical output, its ratio, its first answer token, what it chose."""
    same = "yes" if auto.token_ids == base.token_ids else "NO"
    ratio = auto.timings.total / base.timings.total
    first = _first_answer_line(base.timings.first_answer_token, auto.timings.first_answer_token)
    chose = auto.metrics.get("auto") or {}
    return (
        f"auto (the default): identical output: [bold]{same}[/]   latency ratio auto/baseline: [bold]{ratio:.3f}[/]{first}"
        f"   path {chose.get('path')}, drafts {auto.metrics.get('drafts', 0)}, "
        f"accepted {auto.metrics.get('accepted_tokens', 0)} of {auto.metrics.get('proposed_tokens', 0)} proposed tokens"
    )


def _first_answer_line(base: float | None, ssr: float | None) -> str:
    if base is None or ssr is None or base <= 0:
        return ""
    return f"   first answer token {ssr / base - 1:+.1%} vs baseline"


def _reference_line(ref: dict) -> str:
    """One line on the committed GPU comparison, with the command that reproduces it."""
    return (
        f"on an {ref['device']} ({ref['dtype']}, {ref['date']}), the same model on {ref['items']} held-out "
        f"{ref['benchmark']} items: SSR {ref['speedup']:.3f}x faster ({ref['baseline_latency_s']:.2f} s -> "
        f"{ref['ssr_latency_s']:.2f} s), first answer token {ref['first_answer_token_ratio'] - 1:+.1%}, "
        f"output identical: {'yes' if ref['exact_match'] else 'NO'}\n  reproduce: {ref['command']}"
        "\n  all GPU figures and their commands: docs/results.md"
    )


def _clip(text: str, lines: int) -> str:
    rows = text.strip().splitlines()
    if len(rows) <= lines:
        return "\n".join(rows)
    half = lines // 2
    return "\n".join(rows[:half] + [f"... ({len(rows) - 2 * half} more lines) ..."] + rows[-half:])


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"
