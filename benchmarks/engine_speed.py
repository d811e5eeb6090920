"""Engine speed against transformers, all measured in one run on one device.

Modes (tokens/s for batch 1/2/4/8, same prompt and token count, EOS ignored):
  engine-graph     the engine with CUDA graphs (+ compiled pointwise pieces) — GPU only
  engine-eager     the engine, eager forwards
  generate         transformers `generate`, eager, dynamic cache
  generate-static  transformers `generate(cache_implementation="static")` (it compiles the forward)
Also, on a GPU: the cost of a k-token verify forward (k = 1..64) relative to a 1-token decode;
decode cost against the number of cached tokens with the cache preallocated to the longest;
the floor (weight bytes / measured copy bandwidth); the step-time breakdown (GPU replay time
vs host time per step); SSR overhead with nothing accepted (and with drafts not used) against
the baseline's latency. Compile and capture times are reported and kept out of every timing.

    python benchmarks/engine_speed.py --model smollm2                      # CPU
    python benchmarks/engine_speed.py --model smollm2 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from selfspec.engine.llm_engine import Engine, EngineConfig
from selfspec.engine.model_runner import Chunk
from selfspec.engine.sampling import SamplingParams

# engine-graph-serial: the graph engine without decoding ahead (each step waits for the host's commit).
ALL_MODES = ("engine-graph", "engine-graph-serial", "engine-eager", "generate", "generate-static")
GRAPH: dict = {"cuda_graphs": True}  # --smoke on a CPU: the static path uncaptured instead


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------- throughput
def time_generate(model, prompt_ids: list[int], batch: int, new_tokens: int, repeats: int, static: bool) -> list[float]:
    inputs = torch.tensor([prompt_ids] * batch, device=model.device)
    mask = torch.ones_like(inputs)
    extra = {"cache_implementation": "static"} if static else {}
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                inputs,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                **extra,
            )
        sync()
        samples.append(time.perf_counter() - start)
        assert out.shape[1] - inputs.shape[1] == new_tokens
    return samples


def time_engine(engine: Engine, prompt_ids: list[int], batch: int, new_tokens: int, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        seqs = [
            engine.add_request(prompt_ids, SamplingParams(max_tokens=new_tokens, ignore_eos=True)) for _ in range(batch)
        ]
        while not all(s.is_finished for s in seqs):
            engine.step()
        sync()
        samples.append(time.perf_counter() - start)
        assert all(s.num_output_tokens == new_tokens for s in seqs)
    return samples


# ---------------------------------------------------------------------------------- GPU detail
def measure_copy_bandwidth(device: torch.device, gib: float = 2.0) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written."""
    if device.type != "cuda":
        src = torch.randn(2**24)
        t0 = time.perf_counter()
        src.clone()
        return 2 * src.numel() * 4 / (time.perf_counter() - t0)
    n = int(gib * 2**30 / 2)
    src = torch.randn(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / statistics.median(times)


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def time_runner_forward(engine: Engine, start: int, k: int, reps: int) -> float:
    """Median seconds of one forward of a k-token chunk at `start` (batch 1), as a step runs it."""
    runner = engine.runner
    tokens = [(7 * i + 11) % 1000 + 1 for i in range(k)]
    chunk = Chunk(slot=0, start=start, token_ids=tokens, num_logits=k)
    for _ in range(3):
        runner.run([chunk])
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        runner.run([chunk])  # ends with a device-to-host copy: synchronous
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def key_bucket(engine: Engine, needed: int) -> int | None:
    """The key bucket a step over `needed` positions replays (None: no static forwards)."""
    static = engine.runner.static
    return None if static is None else static.buckets.key_bucket(needed, engine.max_len)


def time_replay_only(engine: Engine, shape: tuple[int, int, int], reps: int = 200) -> float:
    """GPU time of one captured forward, replayed back to back (no host work between); NaN for an
    engine without static forwards (a model that runs eagerly, named in `static_fallback`)."""
    static = engine.runner.static
    if static is None or shape[2] is None:
        return float("nan")
    forward = static.forwards.get(shape) or static._build(shape)
    if forward.graph is None:  # --smoke on a CPU
        t0 = time.perf_counter()
        for _ in range(reps):
            static._body(forward)
        return (time.perf_counter() - t0) / reps
    for _ in range(5):
        forward.graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        forward.graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def ssr_overhead(model, tok, args, device) -> dict:
    """Latency of SSR with every draft token rejected (and with drafts not used) vs the baseline."""
    import selfspec.engine.verify as verify_module
    from selfspec.engine.verify import VerifyResult, verify_greedy
    from selfspec.llm import LLM
    from selfspec.spec.ssr import SSRConfig
    from selfspec.thinking.policy import ThinkingLimits

    llm = LLM.from_model(
        model,
        tok,
        engine_config=EngineConfig(num_slots=8, max_len=args.ssr_cot + args.ssr_answer + 512),
        name=args.model,
    )
    limits = ThinkingLimits(cot_cap=args.ssr_cot, answer_cap=args.ssr_answer, fixed_length=True)
    prompts = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "Write a Python class Stack with push, pop, peek and is_empty methods.",
        "Explain how to find the shortest path in a graph, then give code.",
        "Write a function that merges two sorted lists into one sorted list.",
        "Describe how a hash table handles collisions, with an example.",
        "Write a Python class BankAccount with deposit, withdraw and balance.",
        "Explain binary search and write it in Python.",
        "Write a function that counts the words in a text file.",
    ][: args.ssr_prompts] * args.ssr_repeats
    budget, max_draft = args.ssr_budget, args.ssr_max_draft
    backoffs = [int(b) for b in args.ssr_backoffs.split(",")]
    modes = {
        "baseline": None,
        "ssr-off": SSRConfig(draft_budgets=[budget], max_draft_len=max_draft, reuse="off"),
    }
    # Every draft token rejected, at each suffix back-off cap (the first is the default's).
    for b in backoffs:
        name = "ssr-noaccept" if b == SSRConfig().suffix_backoff_max else f"ssr-noaccept-b{b}"
        modes[name] = SSRConfig(draft_budgets=[budget], max_draft_len=max_draft, suffix_backoff_max=b)
    modes["ssr"] = SSRConfig(draft_budgets=[budget], max_draft_len=max_draft)

    def reject_all(target_argmax, proposal):
        targets = target_argmax.tolist() if isinstance(target_argmax, torch.Tensor) else list(target_argmax)
        return VerifyResult(0, int(targets[0]))

    # Capture every shape these runs can meet (parent + draft rows, verify chunks, all key
    # buckets) before timing, then warm every mode once on a shorter run.
    llm.engine.runner.warm_up_graphs([1, 2], [1, 2, 4, 8, 16, 32, 64], llm.engine.max_len)
    short = ThinkingLimits(cot_cap=budget + 64, answer_cap=128, fixed_length=True)
    for spec in modes.values():
        llm.generate(prompts[0], SamplingParams(max_tokens=10_000), limits=short, thinking=True, spec=spec)
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, list[list[int]]] = {m: [] for m in modes}
    metrics: dict[str, list[dict]] = {m: [] for m in modes}
    for prompt in prompts:
        for mode, spec in modes.items():  # interleaved per prompt
            # `verify_proposal` (the engine's only verification call) looks this name up per call.
            verify_module.verify_greedy = reject_all if mode.startswith("ssr-noaccept") else verify_greedy
            try:
                sync()
                t0 = time.perf_counter()
                (res,) = llm.generate(
                    prompt, SamplingParams(max_tokens=10_000), limits=limits, thinking=True, spec=spec
                )
                sync()
            finally:
                verify_module.verify_greedy = verify_greedy
            times[mode].append(time.perf_counter() - t0)
            tokens[mode].append(res.token_ids)
            metrics[mode].append({k: v for k, v in res.metrics.items() if isinstance(v, (int, float, str))})
    base = times["baseline"]
    out = {
        "cot": args.ssr_cot,
        "answer": args.ssr_answer,
        "draft_budget": budget,
        "max_draft": max_draft,
        "prompts": len(prompts),
        "modes": list(modes),
    }
    for mode in modes:
        ratios = [t / b for t, b in zip(times[mode], base)]
        ratio = statistics.mean(ratios)
        # Standard error of the paired ratio: run-to-run noise is several percent per run
        # (3,500 steps of ~1.4 ms), so a 2% target needs many runs to be resolved.
        stderr = statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
        out[mode] = {
            "mean_latency_s": statistics.mean(times[mode]),
            "latency_vs_baseline": ratio,
            "overhead_pct": 100 * (ratio - 1),
            "overhead_stderr_pct": 100 * stderr,
            "exact": tokens[mode] == tokens["baseline"],
            "per_prompt_latency_s": times[mode],
            "metrics": metrics[mode],
        }
    return out


def random_weights_tokenizer(shape: str):
    """A tokenizer with the chat format of `shape`'s family, over the tiny test vocabulary."""
    from step_profile import SHAPES

    from selfspec.testing.chat_templates import family_tokenizer
    from selfspec.testing.tiny import tiny_tokenizer

    family = SHAPES[shape]["family"]
    if family == "qwen3_5":
        return family_tokenizer("qwen3_5")
    if family == "gemma4":
        return family_tokenizer("gemma4-e")
    return tiny_tokenizer()  # Qwen3's format


# ---------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer directory instead of the model's own (Gemma-3 under transformers 5.17)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--eager-repeats", type=int, default=None, help="repeats for the eager modes (default: --repeats)"
    )
    parser.add_argument(
        "--modes", default=None, help=f"comma list of {ALL_MODES} (default: all that run on the device)"
    )
    parser.add_argument("--static-batches", default="1", help="batches for generate-static (each compiles anew)")
    parser.add_argument("--verify-k", default="1,2,4,8,16,32,64")
    parser.add_argument("--verify-context", type=int, default=512)
    parser.add_argument("--context-lengths", default="128,512,1024,2048,4096,8192")
    # SSR overhead at the paper row's shape: CoT 2000, answer 1500, draft forked at 500, <= 500 tokens.
    parser.add_argument("--ssr-cot", type=int, default=2000)
    parser.add_argument("--ssr-answer", type=int, default=1500)
    parser.add_argument("--ssr-budget", type=int, default=500)
    parser.add_argument("--ssr-max-draft", type=int, default=500)
    parser.add_argument("--ssr-prompts", type=int, default=8, help="prompts (of 8) for the SSR overhead runs")
    parser.add_argument(
        "--ssr-repeats", type=int, default=2, help="each prompt this many times (paired with its baseline)"
    )
    parser.add_argument(
        "--ssr-backoffs", default="16,64", help="suffix back-off caps for the every-token-rejected runs"
    )
    parser.add_argument("--skip-ssr", action="store_true")
    parser.add_argument("--ssr-only", action="store_true", help="only the SSR-overhead runs (file suffix _ssr)")
    parser.add_argument(
        "--out",
        default="/tmp/engine_speed",
        help="where <device>_<model>.json and .md go (committed runs: benchmarks/engine_speed/records/)",
    )
    parser.add_argument(
        "--random-weights",
        action="store_true",
        help="random weights of the model's shapes (see step_profile.SHAPES): same speed, no files",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="CPU: run the GPU-only parts on the uncaptured static path"
    )
    parser.add_argument(
        "--prompt-replay-tokens",
        type=int,
        default=None,
        help="GraphBuckets.prompt_replay_tokens for the graph engines (0: prompt pieces share the padding budget)",
    )
    parser.add_argument(
        "--whole-prompt-pieces",
        action="store_true",
        help="GraphBuckets.split_prompt_pieces off: prompt pieces padded whole, never cut at the token buckets",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="EngineConfig.max_prefill_tokens_per_step for the graph engines (default: the engine's)",
    )
    args = parser.parse_args()
    if args.smoke:
        GRAPH.clear()
        GRAPH.update(static_shapes=True, decode_ahead=True)
    if args.max_prefill_tokens is not None:
        GRAPH["max_prefill_tokens_per_step"] = args.max_prefill_tokens
    if args.prompt_replay_tokens is not None or args.whole_prompt_pieces:
        from selfspec.engine.static_forward import GraphBuckets

        limit = GraphBuckets.prompt_replay_tokens if args.prompt_replay_tokens is None else args.prompt_replay_tokens
        GRAPH["graph_buckets"] = GraphBuckets(
            prompt_replay_tokens=limit, split_prompt_pieces=not args.whole_prompt_pieces
        )

    import transformers

    from selfspec.models import load_model
    from selfspec.thinking.format import ThinkingFormat, build_prompt_ids

    cuda = args.device.startswith("cuda")
    modes = (
        args.modes.split(",")
        if args.modes
        else [m for m in ALL_MODES if cuda or args.smoke or not m.startswith("engine-graph")]
    )
    eager_repeats = args.eager_repeats or args.repeats
    t_load = time.perf_counter()
    if args.random_weights:
        # Same shapes and dtype as the named model, random values: step times are the same,
        # and no model files need to travel. Token outputs are meaningless, so no SSR part.
        sys.path.insert(0, str(Path(__file__).parent))
        from step_profile import shaped_model

        model = shaped_model(args.model, getattr(torch, args.dtype), args.device)
        g = torch.Generator().manual_seed(0)
        prompt_ids = torch.randint(10, 1000, (42,), generator=g).tolist()
        # Token outputs are meaningless, so throughput runs need no tokenizer. The SSR-overhead
        # runs (asked for with --ssr-only) take the family's chat format on the tiny vocabulary:
        # its ids lie inside the model's, the forced lengths end thinking, and drafts of random
        # weights are rejected — the overhead with nothing accepted, as on a real model.
        tok = random_weights_tokenizer(args.model) if args.ssr_only else None
        args.skip_ssr = not args.ssr_only
    else:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer)
        model, tok = loaded.model, loaded.tokenizer
        fmt = ThinkingFormat.detect(tok)
        prompt_ids = build_prompt_ids(tok, args.prompt, fmt, enable_thinking=False)
    log(f"loaded {args.model} in {time.perf_counter() - t_load:.1f}s")
    batches = [int(b) for b in args.batches.split(",")]
    max_len = len(prompt_ids) + args.new_tokens + 64
    meta = {
        "model": args.model + (" (random weights, same shapes)" if args.random_weights else ""),
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "dtype": args.dtype,
        "new_tokens": args.new_tokens,
        "prompt_tokens": len(prompt_ids),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python " + " ".join(sys.argv),
        "setup_seconds": {},
    }
    results: dict = {"meta": meta, "throughput": []}
    if args.ssr_only:
        # Only the SSR-overhead runs: a quiet, longer measurement of the ≤ 2% question.
        results["ssr_overhead"] = ssr_overhead(model, tok, args, torch.device(args.device))
        write_results(results, [], args, cuda, suffix="_ssr")
        return

    # generate-static first, in full: its compiled forward captures CUDA graphs of its own
    # (reduce-overhead), and that capture frees cuBLAS workspaces that graphs captured
    # earlier in the process still point to. Ours are captured after it.
    static_batches = {int(b) for b in args.static_batches.split(",")}
    static_rates: dict[int, float] = {}
    if "generate-static" in modes:
        for b in batches:
            if b not in static_batches:
                continue
            t0 = time.perf_counter()
            try:
                time_generate(model, prompt_ids, b, args.new_tokens, 2, static=True)  # compiles
            except Exception as exc:  # noqa: BLE001 - e.g. a model whose cache has no static form
                meta.setdefault("errors", {})[f"generate-static b{b}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log(f"batch {b} generate-static failed: {meta['errors'][f'generate-static b{b}']}")
                torch._dynamo.reset()
                continue
            meta["setup_seconds"][f"generate-static b{b} compile+2 runs"] = round(time.perf_counter() - t0, 1)
            samples = time_generate(model, prompt_ids, b, args.new_tokens, args.repeats, static=True)
            static_rates[b] = b * args.new_tokens / statistics.median(samples)
            log(f"batch {b} generate-static: {static_rates[b]:.1f} tok/s")

    engines: dict[str, Engine] = {}
    if "engine-eager" in modes:
        engines["engine-eager"] = Engine(
            model, tok, EngineConfig(num_slots=max(batches), max_len=max_len, cuda_graphs=False)
        )
    if "engine-graph" in modes:
        t0 = time.perf_counter()
        engines["engine-graph"] = Engine(model, tok, EngineConfig(num_slots=max(batches), max_len=max_len, **GRAPH))
        captured = engines["engine-graph"].runner.warm_up_graphs(batches, [1, len(prompt_ids)], max_len)
        meta["setup_seconds"]["engine-graph capture+compile"] = round(time.perf_counter() - t0, 1)
        static = engines["engine-graph"].runner.static
        meta["graph_stats_after_warmup"] = static.stats() if static is not None else None
        log(f"graphs captured: {meta['graph_stats_after_warmup']} ({captured:.1f}s)")
    if "engine-graph-serial" in modes:
        t0 = time.perf_counter()
        serial = dict(GRAPH, decode_ahead=False)
        engines["engine-graph-serial"] = Engine(
            model, tok, EngineConfig(num_slots=max(batches), max_len=max_len, **serial)
        )
        engines["engine-graph-serial"].runner.warm_up_graphs(batches, [1, len(prompt_ids)], max_len)
        meta["setup_seconds"]["engine-graph-serial capture+compile"] = round(time.perf_counter() - t0, 1)

    # Warm-up at every batch size: a batch's first prefill may run an eager forward of a shape
    # the compiled pieces have not seen (a recompile), which must not land in a timing.
    for name, engine in engines.items():
        for b in batches:
            time_engine(engine, prompt_ids, b, 8, 1)
    if "generate" in modes:
        time_generate(model, prompt_ids, 1, 8, 1, static=False)

    for b in batches:
        row: dict = {"batch": b}
        for mode in modes:
            if mode == "generate-static":
                if b in static_rates:
                    row[mode] = static_rates[b]
                continue
            if mode == "generate":
                samples = time_generate(model, prompt_ids, b, args.new_tokens, eager_repeats, static=False)
            elif mode == "engine-eager":
                samples = time_engine(engines[mode], prompt_ids, b, args.new_tokens, eager_repeats)
            else:
                samples = time_engine(engines[mode], prompt_ids, b, args.new_tokens, args.repeats)
            row[mode] = b * args.new_tokens / statistics.median(samples)
            log(f"batch {b} {mode}: {row[mode]:.1f} tok/s")
        results["throughput"].append(row)

    if "engine-graph" in engines:
        graph = engines["engine-graph"]
        b1 = results["throughput"][0]
        step_wall = 1.0 / b1["engine-graph"]
        # Verify cost: a k-token chunk vs a 1-token decode, batch 1, same context.
        ctx_engine = Engine(
            model, tok, EngineConfig(num_slots=2, max_len=max(args.verify_context + 128, 1024), **GRAPH)
        )
        ks = [int(k) for k in args.verify_k.split(",")]
        ctx_engine.runner.warm_up_graphs([1], ks, args.verify_context + max(ks))
        verify = {k: time_runner_forward(ctx_engine, args.verify_context, k, 50) for k in ks}
        results["verify_cost"] = [{"k": k, "ms": 1e3 * v, "vs_decode": v / verify[ks[0]]} for k, v in verify.items()]
        log(f"verify cost: {results['verify_cost']}")
        # Decode cost against cached length, cache preallocated to the longest.
        lengths = [int(x) for x in args.context_lengths.split(",")]
        model_ctx = getattr(model.config.get_text_config(), "max_position_embeddings", max(lengths))
        ctx_max = min(max(lengths), model_ctx)
        long_engine = Engine(model, tok, EngineConfig(num_slots=2, max_len=ctx_max, **GRAPH))
        lengths = [n for n in lengths if n <= ctx_max]
        long_engine.runner.warm_up_graphs([1], [1], ctx_max)
        scaling = []
        for n in lengths:
            ms = 1e3 * time_runner_forward(long_engine, n - 1, 1, 50)
            kb = key_bucket(long_engine, n)
            gpu_ms = 1e3 * time_replay_only(long_engine, (1, 1, kb))
            scaling.append({"cached_tokens": n, "key_bucket": kb, "step_ms": ms, "replay_ms": gpu_ms})
        results["decode_vs_cached_length"] = {"preallocated": ctx_max, "rows": scaling}
        del long_engine, ctx_engine
        log(f"decode vs cached length: {scaling}")
        # Floor and step breakdown.
        bw = measure_copy_bandwidth(graph.device)
        wb = weight_bytes(model)
        kb = key_bucket(graph, len(prompt_ids) + args.new_tokens)
        replay = time_replay_only(graph, (1, 1, kb))
        results["floor"] = {
            "weight_bytes": wb,
            "copy_bandwidth_GBps": bw / 1e9,
            "floor_ms_per_step": 1e3 * wb / bw,
            "graph_replay_ms": 1e3 * replay,
            "engine_step_ms": 1e3 * step_wall,
            "host_ms_per_step": 1e3 * (step_wall - replay),
        }
        results["graph_stats"] = graph.runner.static.stats() if graph.runner.static is not None else None
        results["static_fallback"] = getattr(graph.runner, "static_fallback", None)
        if graph.skinny_gemms is not None:
            results["skinny_gemms"] = graph.skinny_gemms.report()
        # The largest batch's step: GPU replay vs host, to tell which one grows with the batch.
        big = max(batches)
        if big > 1 and graph.runner.static is not None and graph.runner.static.buckets.batch_bucket(big) is not None:
            big_rate = next(r["engine-graph"] for r in results["throughput"] if r["batch"] == big)
            big_replay = time_replay_only(graph, (graph.runner.static.buckets.batch_bucket(big), 1, kb))
            results["floor"][f"batch{big}_step_ms"] = 1e3 * big / big_rate
            results["floor"][f"batch{big}_graph_replay_ms"] = 1e3 * big_replay
        log(f"floor: {results['floor']}")
        if not args.skip_ssr:
            del engines
            results["ssr_overhead"] = ssr_overhead(model, tok, args, graph.device)
            log(f"ssr overhead: {json.dumps(results['ssr_overhead'])}")

    write_results(results, modes, args, cuda)


def write_results(results: dict, modes: list[str], args: argparse.Namespace, cuda: bool, suffix: str = "") -> None:
    report = render(results, modes)
    print(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{'cuda' if cuda else 'cpu'}_{args.model}" + ("_random" if args.random_weights else "") + suffix
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2))
    (out / f"{stem}.md").write_text(report)


def render(results: dict, modes: list[str]) -> str:
    meta = results["meta"]
    lines = [
        f"# Engine speed: {meta['model']} on {meta['device']} ({meta['dtype']})",
        "",
        f"`{meta['command']}`",
        "",
        f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}; prompt {meta['prompt_tokens']} tokens, "
        f"{meta['new_tokens']} new tokens per sequence, EOS ignored. Setup (excluded from timings): "
        f"{json.dumps(meta['setup_seconds'])}",
        "",
        "## Tokens/s",
        "",
        "| batch | " + " | ".join(modes) + " | graph / generate | graph / generate-static |",
        "|---|" + "---|" * (len(modes) + 2),
    ]
    for row in results["throughput"]:
        cells = [f"{row[m]:.1f}" if m in row else "–" for m in modes]
        g = row.get("engine-graph")
        ratio = lambda other: f"{g / row[other]:.2f}x" if g and other in row else "–"  # noqa: E731
        lines.append(
            f"| {row['batch']} | " + " | ".join(cells) + f" | {ratio('generate')} | {ratio('generate-static')} |"
        )
    if "verify_cost" in results:
        lines += [
            "",
            "## Verify cost (batch 1, graph engine)",
            "",
            "| k tokens | ms | vs 1-token decode |",
            "|---|---|---|",
        ]
        lines += [f"| {r['k']} | {r['ms']:.3f} | {r['vs_decode']:.2f}x |" for r in results["verify_cost"]]
    if "decode_vs_cached_length" in results:
        d = results["decode_vs_cached_length"]
        lines += [
            "",
            f"## Decode step vs cached tokens (cache preallocated to {d['preallocated']})",
            "",
            "| cached tokens | key bucket | step ms (host+GPU) | graph replay ms (GPU) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['cached_tokens']} | {r['key_bucket']} | {r['step_ms']:.3f} | {r['replay_ms']:.3f} |"
            for r in d["rows"]
        ]
    if "floor" in results:
        f = results["floor"]
        lines += [
            "",
            "## Floor and step breakdown (batch 1 decode)",
            "",
            f"- weights {f['weight_bytes'] / 1e6:.1f} MB / measured copy bandwidth {f['copy_bandwidth_GBps']:.0f} GB/s "
            f"= floor {f['floor_ms_per_step']:.3f} ms per step",
            f"- engine step {f['engine_step_ms']:.3f} ms = graph replay (GPU) {f['graph_replay_ms']:.3f} ms + host "
            f"{f['host_ms_per_step']:.3f} ms",
            f"- graph stats: {json.dumps(results.get('graph_stats'))}",
        ]
    if "ssr_overhead" in results:
        s = results["ssr_overhead"]
        lines += [
            "",
            f"## SSR overhead (batch 1, CoT {s['cot']}, answer {s['answer']}, draft at {s['draft_budget']}, "
            f"{s['prompts']} prompts)",
            "",
            "| mode | mean latency s | vs baseline | overhead (± s.e.) | exact | forwards | draft forwards | answer verify steps | accepted tokens |",
            "|---|---|---|---|---|---|---|---|---|",
        ]

        def mean_metric(r: dict, key: str) -> str:
            values = [m[key] for m in r.get("metrics", []) if key in m]
            return f"{statistics.mean(values):.0f}" if values else "–"

        for mode in s.get("modes", ("baseline", "ssr-off", "ssr-noaccept", "ssr")):
            r = s[mode]
            counts = " | ".join(
                mean_metric(r, k) for k in ("forwards", "draft_forwards", "answer_verify_steps", "accepted_tokens")
            )
            lines.append(
                f"| {mode} | {r['mean_latency_s']:.3f} | {r['latency_vs_baseline']:.3f} | {r['overhead_pct']:+.1f}% ± {r.get('overhead_stderr_pct', float('nan')):.1f} | {r['exact']} | {counts} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
