"""GPU check: CUDA-graph forwards give the eager engine's tokens.

Run on a CUDA machine (the CPU test suite covers the uncaptured static path):

    python tools/gpu/gpu_check.py                     # tiny models only (fp32), ~1 min
    python tools/gpu/gpu_check.py --model smollm2     # plus a bf16 long-generation agreement check
    python tools/gpu/gpu_check.py --model gemma3-270m --tokenizer gemma3-270m=/tmp/m/gemma3-270m-tokenizer
                                                    # a model whose GGUF tokenizer that transformers builds wrongly
    python tools/gpu/gpu_check.py --skip-tiny --hybrid-tiny --hybrid-shape qwen3.5-4b
                                                    # linear-attention models on graphs (transformers >= 5.24)

Checks, each printed PASS/FAIL (exit status 1 on any FAIL):
1. fp32, tiny Llama / Qwen3 / Gemma-3 (sliding window 8): greedy tokens of the captured
   engine (with and without the compiled pointwise twins) equal the eager engine's and
   transformers `generate`'s, for a batch of prompts of different lengths and for
   speculative verification chunks of 1..15 tokens.
2. bf16 real model: teacher-forced on the eager engine's greedy output of `--tokens`
   tokens, the graph engine's top-1 agrees on >= 99.5% of positions.
3. bf16 random weights of a served shape (`--shape qwen3-4b`, see benchmarks/step_profile.py):
   over `--positions` random tokens, the engine's default GPU path (CUDA graphs, compiled
   pointwise pieces, slot attention, skinny GEMMs), teacher-forced one token per step and 16
   per verify forward, agrees with the eager transformers model's top-1 on >= 99.5% of
   positions. Positions where the eager model's own top two logits are within one bf16 step
   of each other are counted apart: there either answer is the model's.
4. `--hybrid-tiny`, fp32 tiny Qwen3.5 / Qwen3-Next (Gated DeltaNet layers, whose per-slot state
   and verify snapshots the graphs route): the graph engine's greedy tokens for a batch equal
   the eager engine's and `generate`'s; speculation with rejected proposals (the state settles
   inside a verify chunk) equals them too, also with batch buckets of at most 2 so that two
   replays of one verify graph run before any row settles. Tokens/s of the greedy batch both
   ways (second run: graphs and compilation warm).
5. `--hybrid-shape qwen3.5-4b`: random bf16 weights of the served shape, batch 1: decode
   tokens/s eager vs graphs; the graph engine teacher-forced on the eager engine's greedy
   output (chunks of 1 and 16: decode and verify graphs) agrees on top-1 (reported; passes at
   >= 99.5% like 3.); a speculative run with rejections that uses the verify graphs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from selfspec.engine.config import EngineConfig
from selfspec.engine.llm_engine import Engine
from selfspec.engine.policy import Proposal, SequencePolicy
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.static_forward import GraphBuckets
from selfspec.engine.verify import VerifyResult
from selfspec.testing.reference import greedy_reference
from selfspec.testing.tiny import HYBRID_FAMILIES, tiny_model

RESULTS: list[dict] = []


def report(name: str, ok: bool, **detail) -> None:
    RESULTS.append({"check": name, "ok": ok, **detail})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(detail)}", flush=True)


def generate_ref(model, prompt: list[int], n: int) -> list[int]:
    return greedy_reference(model, prompt, n)


def run_all(engine: Engine, seqs) -> None:
    while not all(s.is_finished for s in seqs):
        engine.step()


class ChunkProposer(SequencePolicy):
    """Proposes the reference continuation in chunks of 1..15 tokens, some with a wrong last token."""

    def __init__(self, reference: list[int], vocab: int) -> None:
        self.reference, self.vocab, self.calls = reference, vocab, 0

    def propose(self, engine, seq, room):
        self.calls += 1
        k = min(room, 1 + self.calls % 15)
        done = seq.num_output_tokens
        tokens = list(self.reference[done : done + k])
        if not tokens:
            return None
        if self.calls % 4 == 0:
            tokens[-1] = (tokens[-1] + 1) % self.vocab
        return Proposal(tokens)


class TeacherForcing(SequencePolicy):
    """Feeds a fixed token sequence in chunks and records the model's top-1 at every position."""

    custom_verify = True  # the verify below records agreement; it needs the row's logits

    def __init__(self, tokens: list[int], chunk: int) -> None:
        self.tokens, self.chunk = tokens, chunk
        self.agree = self.positions = 0

    def propose(self, engine, seq, room):
        done = seq.num_output_tokens
        k = min(room, self.chunk, len(self.tokens) - done - 1)
        return Proposal(self.tokens[done : done + k]) if k > 0 else None

    def verify(self, engine, seq, logits, proposal):
        top = logits.argmax(dim=-1).tolist()
        done = seq.num_output_tokens
        want = self.tokens[done : done + len(top)]  # top[i] predicts the token at done + i
        self.agree += sum(int(a == b) for a, b in zip(top, want))
        self.positions += len(want)
        return VerifyResult(len(proposal.tokens), self.tokens[done + len(proposal.tokens)])


class TopOneRecorder(TeacherForcing):
    """Teacher forcing that keeps the engine's top-1 at every position (for an outside reference)."""

    def __init__(self, tokens: list[int], chunk: int) -> None:
        super().__init__(tokens, chunk)
        self.top: list[int] = []

    def verify(self, engine, seq, logits, proposal):
        self.top.extend(logits.argmax(dim=-1).tolist())
        return super().verify(engine, seq, logits, proposal)


def check_shape(shape: str, positions: int, device: str = "cuda") -> None:
    """Engine top-1 under its fastest GPU path vs the eager transformers model, random weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from step_profile import shaped_model

    model = shaped_model(shape, torch.bfloat16, device)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, model.config.vocab_size - 10, (positions + 1,), generator=g).tolist()
    with torch.inference_mode():
        logits = model(torch.tensor([tokens], device=device)).logits[0, :-1].float()
    top2 = logits.topk(2, dim=-1)
    reference = top2.indices[:, 0].tolist()
    # One bf16 step at the logit's magnitude: closer than that, rounding decides the order.
    tie = (top2.values[:, 0] - top2.values[:, 1]) <= top2.values[:, 0].abs() * 2.0**-7
    del logits
    engine = Engine(model, None, EngineConfig(num_slots=2, max_len=positions + 64), eos_token_ids=[])
    for chunk in (1, 16):
        recorder = TopOneRecorder(tokens[1:] + [0], chunk)
        seq = engine.add_request(tokens[:1], SamplingParams(max_tokens=positions, ignore_eos=True), policy=recorder)
        run_all(engine, [seq])
        got = recorder.top[:positions]
        same = [a == b for a, b in zip(got, reference)]
        clear = [ok for ok, t in zip(same, tie.tolist()) if not t]
        agree = sum(same) / max(1, len(same))
        report(
            f"{shape}-random-bf16-top1-agreement-chunk{chunk}",
            agree >= 0.995,
            positions=len(same),
            agreement=round(agree, 5),
            near_ties=int(tie.sum()),
            agreement_without_near_ties=round(sum(clear) / max(1, len(clear)), 5),
            skinny_shapes={str(k[:2]): str(v) for k, v in engine.skinny_gemms.choice.items()}
            if engine.skinny_gemms
            else None,
            static=engine.runner.static.stats() if engine.runner.static else None,
        )


def graph_configs(device: str) -> dict[str, dict]:
    if device == "cuda":
        return {
            "eager": dict(cuda_graphs=False),
            "graph": dict(cuda_graphs=True, compile_pointwise=False, slot_attention=False),
            "graph+compile": dict(cuda_graphs=True, compile_pointwise=True, slot_attention=False),
            "graph+compile+slot": dict(cuda_graphs=True, compile_pointwise=True, slot_attention=True),
            "graph+compile+slot-no-ahead": dict(
                cuda_graphs=True, compile_pointwise=True, slot_attention=True, decode_ahead=False
            ),
        }
    # --device cpu: a smoke run of this script, the static path uncaptured.
    return {
        "eager": dict(cuda_graphs=False),
        "static": dict(static_shapes=True),
        "static+ahead": dict(static_shapes=True, decode_ahead=True),
    }


def check_tiny(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    for family in ("llama", "qwen3", "gemma3"):
        kwargs = {"sliding_window": 8} if family == "gemma3" else {}
        model = tiny_model(family, 128, seed=1, num_layers=3, **kwargs).to(device)
        prompts = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (3, 17, 40)]
        refs = [generate_ref(model, p, 150) for p in prompts]
        for label, cfg in graph_configs(device).items():
            engine = Engine(model, None, EngineConfig(num_slots=8, max_len=512, **cfg), eos_token_ids=[])
            seqs = [engine.add_request(p, SamplingParams(max_tokens=150, ignore_eos=True)) for p in prompts]
            run_all(engine, seqs)
            same = [s.output_ids == r for s, r in zip(seqs, refs)]
            spec = engine.add_request(
                prompts[1], SamplingParams(max_tokens=150, ignore_eos=True), policy=ChunkProposer(refs[1], 128)
            )
            run_all(engine, [spec])
            # The first request aborted mid-decode: with decoding ahead the others are taken from a
            # successor that still ran its row, and the next successors run without it.
            cut = [engine.add_request(p, SamplingParams(max_tokens=150, ignore_eos=True)) for p in prompts]
            for _ in range(60):
                engine.step()
            engine.abort_request(cut[0].request_id)
            run_all(engine, cut[1:])
            cut_same = [s.output_ids == r for s, r in zip(cut[1:], refs[1:])]
            cut_same.append(cut[0].output_ids == refs[0][: len(cut[0].output_ids)])
            stats = engine.runner.static.stats() if engine.runner.static else {}
            stats["slot_attention"] = engine.runner.slot_attention
            report(
                f"tiny-{family}-{label}",
                all(same) and spec.output_ids == refs[1] and all(cut_same),
                batch_equal=same,
                spec_equal=spec.output_ids == refs[1],
                abort_equal=cut_same,
                accepted=spec.stats.accepted_tokens,
                static=stats,
                eager_forwards=engine.runner.eager_forwards,
                forwards=engine.runner.forwards,
                decode_ahead=engine.runner.ahead.stats() if engine.runner.ahead is not None else None,
            )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_greedy(engine: Engine, prompts: list[list[int]], n: int, device: str) -> tuple[list[list[int]], float]:
    """Greedy outputs of `prompts` (one batch) and the output tokens per second."""
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts]
    sync(device)
    start = time.perf_counter()
    run_all(engine, seqs)
    sync(device)
    return [s.output_ids for s in seqs], sum(len(s.output_ids) for s in seqs) / (time.perf_counter() - start)


def check_hybrid_tiny(device: str) -> None:
    """Linear-attention models on the graph path: exact against eager and `generate` (fp32)."""
    g = torch.Generator().manual_seed(0)
    for family in HYBRID_FAMILIES:
        model = tiny_model(family, 128, seed=1, num_layers=4).to(device)
        prompts = [torch.randint(1, 128, (n,), generator=g).tolist() for n in (3, 17, 40)]
        refs = [generate_ref(model, p, 100) for p in prompts]
        speeds: dict[str, float] = {}
        for label, cfg in graph_configs(device).items():
            engine = Engine(model, None, EngineConfig(num_slots=8, max_len=512, **cfg), eos_token_ids=[])
            first, _ = timed_greedy(engine, prompts, 100, device)  # builds the graphs it needs
            second, speeds[label] = timed_greedy(engine, prompts, 100, device)
            spec = [
                engine.add_request(p, SamplingParams(max_tokens=100, ignore_eos=True), policy=ChunkProposer(r, 128))
                for p, r in zip(prompts, refs)
            ]
            run_all(engine, spec)
            # The first request aborted mid-decode: decoding ahead takes the others from a successor
            # that still advanced its row's state (a freed slot), then runs without it.
            cut = [engine.add_request(p, SamplingParams(max_tokens=100, ignore_eos=True)) for p in prompts]
            for _ in range(50):
                engine.step()
            engine.abort_request(cut[0].request_id)
            run_all(engine, cut[1:])
            cut_ok = [s.output_ids for s in cut[1:]] == refs[1:] and cut[0].output_ids == refs[0][
                : len(cut[0].output_ids)
            ]
            # Batch buckets of at most 2: four verify rows take two replays of one graph per step.
            narrow = Engine(
                model,
                None,
                EngineConfig(num_slots=8, max_len=512, graph_buckets=GraphBuckets(batch=(1, 2)), **cfg),
                eos_token_ids=[],
            )
            rows = [*prompts, prompts[1][:9]]
            narrow_refs = [*refs, generate_ref(model, rows[-1], 100)]
            replayed = [
                narrow.add_request(p, SamplingParams(max_tokens=100, ignore_eos=True), policy=ChunkProposer(r, 128))
                for p, r in zip(rows, narrow_refs)
            ]
            run_all(narrow, replayed)
            greedy_ok = first == refs and second == refs
            spec_ok = [s.output_ids for s in spec] == refs
            replay_ok = [s.output_ids for s in replayed] == narrow_refs
            static = engine.runner.static
            report(
                f"hybrid-tiny-{family}-{label}",
                greedy_ok and spec_ok and replay_ok and cut_ok and engine.runner.static_fallback is None,
                greedy_equal=greedy_ok,
                spec_equal=spec_ok,
                abort_equal=cut_ok,
                decode_ahead=engine.runner.ahead.stats() if engine.runner.ahead is not None else None,
                two_replays_before_settle_equal=replay_ok,
                accepted=sum(s.stats.accepted_tokens for s in spec),
                tokens_per_s=round(speeds[label], 1),
                speedup_vs_eager=round(speeds[label] / speeds["eager"], 2),
                static=static.stats() if static else None,
                narrow_static=narrow.runner.static.stats() if narrow.runner.static else None,
                static_fallback=engine.runner.static_fallback,
                eager_forwards=engine.runner.eager_forwards,
                forwards=engine.runner.forwards,
            )
            del engine, narrow


def check_hybrid_shape(shape: str, tokens: int, device: str) -> None:
    """A served linear-attention shape in bf16 (random weights): eager vs graphs at batch 1."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from step_profile import shaped_model

    model = shaped_model(shape, torch.bfloat16 if device == "cuda" else torch.float32, device)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, model.config.vocab_size - 10, (32,), generator=g).tolist()
    max_len = len(prompt) + tokens + 80
    eager = Engine(model, None, EngineConfig(num_slots=2, max_len=max_len, cuda_graphs=False), eos_token_ids=[])
    timed_greedy(eager, [prompt], 8, device)  # lazy inits
    (reference,), eager_speed = timed_greedy(eager, [prompt], tokens, device)
    del eager
    if device == "cuda":
        torch.cuda.empty_cache()
    cfg = EngineConfig(num_slots=2, max_len=max_len, max_proposal_tokens=15)
    if device != "cuda":
        cfg.static_shapes = True
    graph = Engine(model, None, cfg, eos_token_ids=[])
    # Decode, and every verify width the speculative run below uses: no capture while timed.
    capture = graph.runner.warm_up_graphs([1], [1, 2, 4, 8, 16], max_len)
    timed_greedy(graph, [prompt], 8, device)
    (free,), graph_speed = timed_greedy(graph, [prompt], tokens, device)
    common = next((i for i, (a, b) in enumerate(zip(free, reference)) if a != b), len(reference))
    agreement = {}
    for chunk in (1, 16):
        forcing = TeacherForcing(reference, chunk)
        s = graph.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), policy=forcing)
        run_all(graph, [s])
        agreement[chunk] = round(forcing.agree / max(1, forcing.positions), 5)
    spec = graph.add_request(
        prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), policy=ChunkProposer(free, model.config.vocab_size)
    )
    sync(device)
    start = time.perf_counter()
    run_all(graph, [spec])
    sync(device)
    spec_speed = len(spec.output_ids) / (time.perf_counter() - start)
    stats = graph.runner.static.stats() if graph.runner.static else {}
    spec_common = next((i for i, (a, b) in enumerate(zip(spec.output_ids, free)) if a != b), len(free))
    report(
        f"hybrid-{shape}-random-bf16-graphs",
        bool(stats)
        and not stats.get("capture_error")
        and graph.runner.static_fallback is None
        and min(agreement.values()) >= 0.995,
        eager_tokens_per_s=round(eager_speed, 1),
        graph_tokens_per_s=round(graph_speed, 1),
        speedup=round(graph_speed / eager_speed, 2),
        speculative_tokens_per_s=round(spec_speed, 1),
        speculative_accepted=spec.stats.accepted_tokens,
        speculative_common_prefix_with_graph_greedy=spec_common,
        top1_agreement_with_eager={f"chunk{k}": v for k, v in agreement.items()},
        free_running_common_prefix=common,
        tokens=tokens,
        capture_seconds=round(capture, 1),
        snapshot_bytes=sum(t.numel() * t.element_size() for t in graph.runner.state.recurrent_snapshots.values()),
        static=stats,
        eager_forwards=graph.runner.eager_forwards,
        forwards=graph.runner.forwards,
    )


def check_sps(device: str) -> None:
    """Draft-model speculation (the draft = the target's first layer, its own graphs) is exact."""
    from selfspec.config import DraftModelConfig
    from selfspec.llm import LLM
    from selfspec.testing.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    model = tiny_model("qwen3", len(tok), seed=3, num_layers=3).to(device)
    llm = LLM.from_model(model, tok, engine_config=EngineConfig(num_slots=4, max_len=512), draft="layers:1")
    prompts = ["def add(a, b):", "Write a counter class", "hello"]
    params = SamplingParams(max_tokens=80, ignore_eos=True)
    base = llm.generate(prompts, params, spec=None)
    sps = llm.generate(prompts, params, spec=DraftModelConfig())
    same = [a.token_ids == b.token_ids for a, b in zip(base, sps)]
    report(
        "sps-draft-layers1",
        all(same),
        equal=same,
        draft_graphs=llm.draft_runner.runner.static.stats() if llm.draft_runner.runner.static else None,
    )


def check_real(model_name: str, tokens: int, device: str, tokenizer: str | None = None) -> None:
    from selfspec.models import load_model
    from selfspec.thinking.format import ThinkingFormat, build_prompt_ids

    loaded = load_model(
        model_name, device=device, dtype="bfloat16" if device == "cuda" else "float32", tokenizer=tokenizer
    )
    model, tok = loaded.model, loaded.tokenizer
    fmt = ThinkingFormat.detect(tok)
    prompt = build_prompt_ids(
        tok, "Write a long, detailed tutorial on Python classes with many examples.", fmt, enable_thinking=False
    )
    # Teacher forcing scores every reference token but the first (the prefill's) and, in chunks of
    # one, the last: two more make at least `tokens` scored positions.
    tokens += 2
    max_len = len(prompt) + tokens + 64
    eager = Engine(model, tok, EngineConfig(num_slots=2, max_len=max_len, cuda_graphs=False), eos_token_ids=[])
    seq = eager.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    run_all(eager, [seq])
    reference = seq.output_ids
    del eager
    graph_cfg = list(graph_configs(device).values())[-1]
    graph = Engine(model, tok, EngineConfig(num_slots=2, max_len=max_len, **graph_cfg), eos_token_ids=[])
    free = graph.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True))
    run_all(graph, [free])
    common = next((i for i, (a, b) in enumerate(zip(free.output_ids, reference)) if a != b), len(reference))
    for chunk in (1, 16):
        forcing = TeacherForcing(reference, chunk)
        s = graph.add_request(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), policy=forcing)
        run_all(graph, [s])
        n = forcing.positions
        agree = forcing.agree / max(1, n)
        report(
            f"{model_name}-{loaded.model.dtype}-top1-agreement-chunk{chunk}",
            agree >= 0.995,
            positions=n,
            agreement=round(agree, 5),
            free_running_common_prefix=common,
            static=graph.runner.static.stats(),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="also check this real model in bf16 (repeatable)")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument(
        "--shape", action="append", default=[], help="also check random weights of this shape in bf16 (repeatable)"
    )
    parser.add_argument("--positions", type=int, default=2000, help="teacher-forced positions per --shape")
    parser.add_argument("--skip-tiny", action="store_true", help="only the --model / --shape / --hybrid-* checks")
    parser.add_argument(
        "--hybrid-tiny", action="store_true", help="tiny Qwen3.5 / Qwen3-Next on graphs vs eager (fp32, exact)"
    )
    parser.add_argument(
        "--hybrid-shape",
        action="append",
        default=[],
        help="random bf16 weights of a linear-attention shape (qwen3.5-4b): tokens/s eager vs graphs (repeatable)",
    )
    parser.add_argument("--hybrid-tokens", type=int, default=128, help="tokens generated per --hybrid-shape run")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of the static path")
    parser.add_argument(
        "--tokenizer",
        action="append",
        default=[],
        metavar="MODEL=DIR",
        help="tokenizer directory for one --model instead of its own (repeatable; e.g. "
        "gemma3-270m=/tmp/m/gemma3-270m-tokenizer where transformers 5.17 builds Gemma-3's wrongly)",
    )
    args = parser.parse_args()
    tokenizers = dict(item.split("=", 1) for item in args.tokenizer if "=" in item)
    unknown = [item for item in args.tokenizer if "=" not in item or item.split("=", 1)[0] not in args.model]
    if unknown:
        parser.error(f"--tokenizer {unknown[0]!r}: give MODEL=DIR for a model named by --model")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script checks CUDA graphs (the CPU tests cover the static path)")
        return 2
    start = time.perf_counter()
    if not args.skip_tiny:
        check_tiny(args.device)
        check_sps(args.device)
    if args.hybrid_tiny:
        check_hybrid_tiny(args.device)
    for shape in args.hybrid_shape:
        check_hybrid_shape(shape, args.hybrid_tokens, args.device)
    for shape in args.shape:
        check_shape(shape, args.positions, args.device)
    for name in args.model:
        check_real(name, args.tokens, args.device, tokenizers.get(name))
    meta = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(json.dumps(meta))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "results": RESULTS}, fh, indent=2)
    return 0 if all(r["ok"] for r in RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
